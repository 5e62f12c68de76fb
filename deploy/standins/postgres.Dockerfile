# A stand-in for postgres:16 (Debian's PostgreSQL 15) that honours what compose.yaml asks
# of the official image: POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB on the first
# start, the data in /var/lib/postgresql/data (a volume keeps it), `pg_isready` on PATH,
# password authentication from other containers. Built by scripts/compose-check; never
# pushed.
ARG DEBIAN_IMAGE=inferq-standin/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
USER postgres
EXPOSE 5432
ENTRYPOINT ["postgres-entrypoint.sh"]
CMD ["postgres"]
