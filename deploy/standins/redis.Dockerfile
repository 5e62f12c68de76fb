# A stand-in for redis:7.4 (Debian's Redis 7.0): `redis-server` and `redis-cli` on PATH,
# data in /data, run as the redis user, protected mode off, as the official image does. Built by
# scripts/compose-check; never pushed.
ARG DEBIAN_IMAGE=inferq-standin/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir /data && chown redis:redis /data
COPY redis-entrypoint.sh /usr/local/bin/redis-entrypoint.sh
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["redis-entrypoint.sh"]
CMD ["redis-server"]
