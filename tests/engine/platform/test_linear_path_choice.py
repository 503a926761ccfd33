"""The linear-layer routers' timing: a bucket a burst of other work slowed down is timed again; buckets past
one whose call is too slow to time again are extrapolated."""

from vriksha.engine.platform.linear_path_choice import (
    INVERSION,
    MAX_TIMED_CALL_SECONDS,
    RETIMES,
    extrapolated,
    retime_inversions,
    time_buckets_until_slow,
)


def test_a_bucket_slower_than_a_larger_one_is_timed_again_keeping_each_paths_best():
    timings = [
        {"packed": 8e-3, "dense": 6.0e-5},  # disturbed: 1 row 300x slower than 2 rows on the same path
        {"packed": 2.4e-5, "dense": 4.0e-5},
        {"packed": 5.3e-5, "dense": 1.0e-4},
    ]
    asked = []

    def time_bucket(i: int) -> dict[str, float]:
        asked.append(i)
        return {"packed": 2.1e-5, "dense": 3.0e-4}

    assert retime_inversions(timings, time_bucket) == 1
    assert asked == [0]
    assert timings[0] == {"packed": 2.1e-5, "dense": 6.0e-5}  # each path its best of both timings
    assert timings[1:] == [{"packed": 2.4e-5, "dense": 4.0e-5}, {"packed": 5.3e-5, "dense": 1.0e-4}]


def test_consistent_timings_are_left_alone_and_a_lasting_inversion_is_kept_after_the_retries():
    consistent = [{"a": 1e-5}, {"a": 1.5e-5}, {"a": 1e-5 * INVERSION * 1.4}]

    def never(i: int) -> dict[str, float]:
        raise AssertionError(f"bucket {i} timed again")

    assert retime_inversions(consistent, never) == 0

    lasting = [{"a": 1e-3, "only_here": 1.0}, {"a": 1e-5}]  # a path timed on one bucket only is not compared
    calls = []
    assert retime_inversions(lasting, lambda i: calls.append(i) or {"a": 5e-4}) == RETIMES
    assert calls == [0] * RETIMES
    assert lasting[0] == {"a": 5e-4, "only_here": 1.0}


def test_larger_buckets_are_settled_first():
    timings = [
        {"a": 4e-5},
        {"a": 9e-3},
        {"a": 3e-5},
    ]  # bucket 1 disturbed; bucket 0 only looks fine against it
    order = []

    def time_bucket(i: int) -> dict[str, float]:
        order.append(i)
        return {"a": 2e-5}

    retime_inversions(timings, time_bucket)
    assert order == [1]
    assert [t["a"] for t in timings] == [4e-5, 2e-5, 3e-5]


def test_timing_stops_after_the_first_bucket_with_a_call_too_slow_to_time_again():
    slow = 2 * MAX_TIMED_CALL_SECONDS
    seconds = [
        {"fast": 1e-4, "emulated": slow / 50},  # 1 row
        {"fast": 2e-4, "emulated": slow},  # 64 rows: in line with the arithmetic of 1 row
        {"fast": 4e-4, "emulated": 4 * slow},
    ]
    timed: list[int] = []

    def time_bucket(i: int) -> dict[str, float]:
        timed.append(i)
        return seconds[i]

    got = time_buckets_until_slow(time_bucket, (1, 64, 256), 3)
    assert timed == [0, 1] and got == seconds[:2]
    assert extrapolated(got, (1, 64, 256))[2] == {"fast": 8e-4, "emulated": 4 * slow}
    timed.clear()
    assert time_buckets_until_slow(time_bucket, (1, 64, 256), 1) == seconds[:1] and timed == [0]


def test_a_slow_call_out_of_line_with_the_bucket_before_is_other_work_and_timing_goes_on():
    seconds = [
        {"packed": 1e-3, "dense": 1e-3},
        {"packed": 2 * MAX_TIMED_CALL_SECONDS, "dense": 2e-3},  # 500x its 1-row time for 2 rows: disturbed
        {"packed": 4e-3, "dense": 4e-3},
    ]
    timed: list[int] = []

    def time_bucket(i: int) -> dict[str, float]:
        timed.append(i)
        return seconds[i]

    assert time_buckets_until_slow(time_bucket, (1, 2, 4), 3) == seconds and timed == [0, 1, 2]
