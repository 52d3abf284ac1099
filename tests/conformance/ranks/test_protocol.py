"""The pool's messages carry tensors: a plain dense CPU tensor as its dtype, shape and bytes, any other
by torch's own reduction, and either way the controller gets back what the rank sent."""

from __future__ import annotations

import pickle

import pytest
import torch

from conformance.ranks import protocol


def _cases() -> dict:
    return {
        "float32": torch.randn(4, 6, device="cpu"),
        "bfloat16": torch.randn(3, device="cpu").bfloat16(),
        "bool": torch.tensor([True, False, True], device="cpu"),
        "int64 0-dim": torch.tensor(7, device="cpu"),
        "no elements": torch.empty(0, 3, device="cpu"),
        "complex64": torch.randn(2, dtype=torch.complex64, device="cpu"),
        "uint16": torch.arange(5, dtype=torch.int32, device="cpu").to(torch.uint16),
        "float8_e4m3fn": torch.randn(4, device="cpu").to(torch.float8_e4m3fn),
    }


def _fallbacks() -> dict:
    return {
        "transposed": torch.randn(4, 6, device="cpu").t(),
        "a slice of a larger storage": torch.arange(10.0, device="cpu")[2:5],
        "requires grad": torch.ones(2, requires_grad=True, device="cpu"),
        "on the meta device": torch.empty(3, device="meta"),
        "conjugated": torch.randn(2, dtype=torch.complex64, device="cpu").conj(),
    }


def _round_trip(value):
    message = protocol.encode(protocol.RESULT, call=1, value=value)
    return message, pickle.loads(message)[1]["value"]


def _bits(tensor):
    return tensor.detach().resolve_conj().contiguous().reshape(-1).view(torch.uint8)


def _assert_same(got, sent):
    assert (type(got), got.dtype, got.shape, got.stride(), got.requires_grad, got.device) == \
        (type(sent), sent.dtype, sent.shape, sent.stride(), sent.requires_grad, sent.device)
    if sent.device.type == "cpu":
        assert torch.equal(_bits(got), _bits(sent))


@pytest.mark.parametrize("name", list(_cases()))
def test_a_plain_cpu_tensor_travels_as_its_bytes(name):
    sent = _cases()[name]
    message, got = _round_trip(sent)
    assert b"_tensor_from_bytes" in message and b"_load_from_bytes" not in message  # not torch.save per storage
    _assert_same(got, sent)
    before = _bits(sent).clone()
    _bits(got)[:1].bitwise_not_()  # the copy is writable, and its own memory
    assert torch.equal(_bits(sent), before)


@pytest.mark.parametrize("name", list(_fallbacks()))
def test_any_other_tensor_keeps_torchs_reduction(name):
    sent = _fallbacks()[name]
    message, got = _round_trip(sent)
    assert b"_tensor_from_bytes" not in message
    _assert_same(got, sent)


@pytest.mark.parametrize("name", list(_cases()))
def test_a_tensor_arrives_on_the_cpu_whatever_the_default_device(name):
    sent = _cases()[name]
    with torch.device("meta"):  # as on a rank, outside its functions
        _, got = _round_trip(sent)
    _assert_same(got, sent)


def test_a_parameter_arrives_as_a_parameter():
    sent = torch.nn.Parameter(torch.ones(2, device="cpu"))
    _, got = _round_trip(sent)
    _assert_same(got, sent)


def test_one_tensor_sent_twice_arrives_as_one():
    tensor = torch.randn(3, device="cpu")
    _, (first, second) = _round_trip([tensor, tensor])
    assert first is second
