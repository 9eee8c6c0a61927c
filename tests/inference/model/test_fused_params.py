"""`concat_params`: one buffer backs a group of parameters; replacing any of them rebuilds it."""

from __future__ import annotations

import torch
from torch import nn

from inference.model.fused_params import concat_params


def _group() -> list[nn.Parameter]:
    return [nn.Parameter(torch.full((2, 3), float(i))) for i in range(3)]


def test_the_buffer_backs_every_parameter_and_is_kept_while_unchanged():
    params = _group()
    buf = concat_params(params, None)
    assert buf.view(-1, 3).tolist() == [[0.0] * 3] * 2 + [[1.0] * 3] * 2 + [[2.0] * 3] * 2
    with torch.no_grad():
        params[1].copy_(torch.full((2, 3), 7.0))  # in place (how the loaders write): seen by the buffer
    assert concat_params(params, buf) is buf
    assert buf.view(-1, 3)[2:4].eq(7.0).all()


def test_a_parameter_replaced_in_the_middle_rebuilds_the_buffer():
    params = _group()
    buf = concat_params(params, None)
    params[1].data = torch.full((2, 3), 5.0)  # a new tensor, not written into the buffer
    rebuilt = concat_params(params, buf)
    assert rebuilt is not buf
    assert rebuilt.view(-1, 3)[2:4].eq(5.0).all()
    assert concat_params(params, rebuilt) is rebuilt


def test_a_dtype_change_rebuilds_the_buffer():
    params = _group()
    buf = concat_params(params, None)
    for p in params:
        p.data = p.data.double()
    rebuilt = concat_params(params, buf)
    assert rebuilt.dtype == torch.float64 and rebuilt is not buf
