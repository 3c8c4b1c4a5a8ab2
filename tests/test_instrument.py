"""What a rank measures, on a plain module in this process: compute spans, bytes out, peak memory."""

import torch
from torch import nn

from pipeline.stage.instrument import CommClock, ComputeClock, Peak


def test_compute_clock_records_a_span_and_the_bytes_of_each_call():
    mod = nn.Linear(4, 3)
    clock = ComputeClock(mod, torch.device("cpu"))
    t0 = clock.now()
    for _ in range(2):
        mod(torch.zeros(5, 4))
    spans = clock.resolve(t0)
    assert [mb for mb, _, _ in spans] == [0, 1] and all(0 <= a <= b for _, a, b in spans)
    assert clock.out_bytes == 2 * 5 * 3 * 4
    clock.close()
    mod(torch.zeros(5, 4))
    assert len(clock.spans) == 2  # closed: the hooks are gone


def test_comm_clock_and_peak_memory():
    comm = CommClock(lambda: 0.0)
    comm.add("send", 1.0, 1.5)
    assert comm.resolve(0.5, cuda=False) == [("send", 0.5, 1.0)]
    peak = Peak(torch.device("cpu"))
    peak.reset()
    assert peak.read() >= peak.base > 0
    held = torch.ones(64 * 2**20 // 4)  # 64 MiB touched inside the window
    assert peak.read() - peak.base >= 60 * 2**20
    del held
    peak.reset()  # a new window starts from what is held now (the freed tensor trimmed away)
    assert peak.read() - peak.base < 60 * 2**20
