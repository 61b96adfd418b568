"""A long-running command stops on SIGTERM even when the kernel hands the signal to another thread."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

# The main thread blocks SIGTERM, so the kernel must deliver it to the other thread, as it may
# to one of gRPC's in a zone: a main thread in `Event.wait()` never ran the handler (CI's hang).
_CHILD = textwrap.dedent(
    """
    import signal, sys, threading, time
    from fedshard.cli._signals import StopSignal

    stop = StopSignal()
    other = threading.Thread(target=lambda: time.sleep(60), daemon=True)
    other.start()  # SIGTERM unblocked in it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print("ready", flush=True)
    assert stop.wait(timeout=50), "no stop seen"
    print("stopped", flush=True)
    """
)


def test_a_stop_signal_delivered_to_another_thread_is_seen() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=55)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.strip() == "stopped"


def test_a_wait_with_a_timeout_returns_false_when_no_signal_came() -> None:
    from fedshard.cli._signals import StopSignal

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop = StopSignal()
        assert stop.wait(timeout=0.05) is False and not stop.requested
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
