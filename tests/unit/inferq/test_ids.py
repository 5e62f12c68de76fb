import threading

from inferq.ids import new_id


def test_ids_increase_strictly_even_within_one_millisecond() -> None:
    ids = [new_id("job_") for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(len(i) == len("job_") + 32 for i in ids)


def test_ids_from_many_threads_are_unique() -> None:
    made: list[str] = []

    def make() -> None:
        made.extend(new_id("x") for _ in range(1000))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 4000
