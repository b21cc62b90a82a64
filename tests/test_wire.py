"""helpers.dist.wire: the bytes each collective puts on a veth pair, counted by the kernel.
Notebook 08 rests on the last test: Gloo's reduce-scatter sends what its all-reduce sends."""

from __future__ import annotations

import pytest

from helpers.dist.netns import why_no_namespaces
from helpers.dist.wire import bytes_sent

MESSAGE = 8_000_000
reason = why_no_namespaces()
pytestmark = pytest.mark.skipif(reason is not None, reason=f"network namespaces: {reason}")


@pytest.fixture(scope="module")
def sent():
    return bytes_sent(MESSAGE, repeats=2)


def test_all_reduce_and_all_gather_send_what_a_ring_sends(sent):
    # 2 workers: a ring all-reduce sends 2(N-1)/N = 1 message per worker, an all-gather half;
    # the TCP/IP headers add well under 5%
    assert sent["all_reduce"] == pytest.approx(MESSAGE, rel=0.05)
    assert sent["all_gather"] == pytest.approx(MESSAGE / 2, rel=0.05)


def test_gloos_reduce_scatter_sends_a_whole_all_reduce(sent):
    assert sent["reduce_scatter"] == pytest.approx(sent["all_reduce"], rel=0.05), (
        "Gloo's reduce-scatter no longer sends a whole all-reduce: notebook 08's section 4 says "
        "it does, and must be revised"
    )


def test_a_message_that_cannot_be_split_is_refused():
    with pytest.raises(ValueError, match="multiple of 8"):
        bytes_sent(12)
