"""Unit tests of the worker's idle wait (python/mcstore/vllm/worker.py): a step that schedules
no tokens blocks until a transfer completes instead of letting vLLM's engine loop spin on the
GIL the transfer threads need; a lone load in such a step runs on the calling thread itself.
Logic only, no timing assertions."""

import threading
from collections import defaultdict
from concurrent.futures import Future

import pytest

from mcstore.vllm.worker import WorkerSide


def worker(idle_wait_ms):
    """A WorkerSide with only the state the idle wait reads (no daemon, no vLLM engine)."""
    w = object.__new__(WorkerSide)
    w.cfg = {"idle_wait_ms": idle_wait_ms}
    w.lock = threading.Lock()
    w.loads, w.saves, w.finishing = {}, defaultdict(list), set()
    w.totals = defaultdict(float)
    w.mem = None   # host memory: no GPU work to order transfers after
    return w


def finish_later(fut, event):
    def run():
        event.wait(30)
        fut.set_result(None)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_idle_step_waits_until_a_load_completes():
    w = worker(idle_wait_ms=1000)
    fut, go = Future(), threading.Event()
    w.loads["r1"] = fut
    t = finish_later(fut, go)
    # The load completes while the step waits (the event is set from a timer on another thread).
    threading.Timer(0.05, go.set).start()
    w._wait_while_idle()
    assert fut.done(), "the idle step returned before the in-flight load completed"
    assert w.totals["idle_wait_s"] > 0
    t.join(5)


def test_saves_of_finishing_requests_count_but_others_do_not():
    w = worker(idle_wait_ms=1000)
    running = Future()
    w.saves["still-running"].append(running)   # not finishing: vLLM does not wait on it
    w._wait_while_idle()
    assert not running.done() and w.totals["idle_wait_s"] == 0
    fut, go = Future(), threading.Event()
    w.saves["done-req"].append(fut)
    w.finishing.add("done-req")
    t = finish_later(fut, go)
    threading.Timer(0.05, go.set).start()
    w._wait_while_idle()
    assert fut.done()
    t.join(5)


@pytest.mark.parametrize("case", ["disabled", "nothing-in-flight", "one-already-done"])
def test_no_wait(case):
    w = worker(idle_wait_ms=0 if case == "disabled" else 1000)
    pending = Future()
    if case != "nothing-in-flight":
        w.loads["pending"] = pending
    if case == "one-already-done":
        done = Future()
        done.set_result(None)
        w.loads["done"] = done
    w._wait_while_idle()   # returns at once: nothing would complete the pending one
    assert not pending.done()
    assert w.totals["idle_wait_s"] == 0


def test_the_wait_is_bounded():
    w = worker(idle_wait_ms=20)
    w.loads["never"] = Future()
    w._wait_while_idle()   # returns after ~20 ms though the load never completes
    assert not w.loads["never"].done()
    assert w.totals["idle_wait_s"] > 0


class Job:
    def __init__(self, req_id):
        self.req_id = req_id


class Meta:
    def __init__(self, loads, idle):
        self.loads, self.idle = [Job(r) for r in loads], idle


def loading_worker(load_async=True):
    """A WorkerSide whose _load records the thread it ran on."""
    from concurrent.futures import ThreadPoolExecutor
    w = worker(idle_wait_ms=1000)
    w.cfg["load_async"] = load_async
    w.pool = ThreadPoolExecutor(max_workers=2)
    w.ran_on = []

    def load(job, ready=None):
        w.ran_on.append((job.req_id, threading.get_ident()))
        return set(), {}, []
    w._load = load
    return w


def test_a_lone_load_in_an_idle_step_runs_on_the_calling_thread():
    w = loading_worker()
    w.start_loads(Meta(["a"], idle=True))
    assert w.ran_on == [("a", threading.get_ident())]
    assert w.loads["a"].done() and w.loads["a"].result() == (set(), {}, [])
    # beside a forward, or several loads in one idle step: the pool, the caller goes on
    w.start_loads(Meta(["b"], idle=False))
    w.start_loads(Meta(["c", "d"], idle=True))
    for rid in "bcd":
        w.loads[rid].result(timeout=30)
    assert all(t != threading.get_ident() for job, t in w.ran_on[1:])
    assert sorted(job for job, _ in w.ran_on) == ["a", "b", "c", "d"]
    w.pool.shutdown()
