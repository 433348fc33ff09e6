"""``oasr.layers.derived``: a value derived from module tensors is built once per version of its sources,
rebuilt after an in-place edit, ``load_state_dict``, a moved or replaced storage or a new ``extra``, kept per
owner (modules sharing a weight each follow its edits), and neither cached nor detached under autograd."""

from __future__ import annotations

import copy as copy_module
import gc
import pickle
import weakref

import pytest
import torch

from oasr.layers import Linear
from oasr.layers.derived import SameValues, derived, forget, kept, row_major


class Counted:
    """``build`` for :func:`derived`: the weight times two, counting its calls."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.builds = module, 0

    def __call__(self) -> torch.Tensor:
        self.builds += 1
        return self.module.weight * 2

    def get(self) -> torch.Tensor:
        return derived(self.module, "double", [self.module.weight, self.module.bias], self)


@pytest.fixture
def lin() -> Linear:
    torch.manual_seed(0)
    return Linear(6, 4).eval()


def test_built_once_then_reused(lin):
    counted = Counted(lin)
    with torch.no_grad():
        first = counted.get()
        assert counted.get() is first
        assert torch.equal(first, lin.weight * 2)
    with torch.inference_mode():
        assert counted.get() is first
    assert counted.builds == 1
    assert kept(lin) == ("double",)


def test_rebuilt_after_an_in_place_edit(lin):
    counted = Counted(lin)
    with torch.no_grad():
        counted.get()
        lin.weight.mul_(-3.0)
        assert torch.equal(counted.get(), lin.weight * 2)
        lin.bias.add_(1.0)  # any source, not only the one build reads
        counted.get()
        counted.get()
    assert counted.builds == 3


def test_rebuilt_after_load_state_dict(lin):
    counted = Counted(lin)
    other = Linear(6, 4)
    with torch.no_grad():
        counted.get()
        lin.load_state_dict(other.state_dict())
        assert torch.equal(counted.get(), other.weight * 2)
        lin.load_state_dict({k: v.clone() for k, v in other.state_dict().items()}, assign=True)  # new storages
        assert torch.equal(counted.get(), other.weight * 2)
    assert counted.builds == 3


def test_rebuilt_after_the_storage_is_replaced_or_moved(lin):
    counted = Counted(lin)
    with torch.no_grad():
        counted.get()
        lin.weight.data = torch.randn(4, 6)  # same Parameter and version counter, new storage
        assert torch.equal(counted.get(), lin.weight * 2)
        lin.double()
        assert counted.get().dtype == torch.float64
    assert counted.builds == 3


def test_a_freed_storage_at_the_same_address_is_not_taken_for_the_old_one(lin, monkeypatch):
    """The key's addresses and versions match, but the storage the value was built from is gone."""
    counted = Counted(lin)
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda self: 1)  # every address looks the same
    with torch.no_grad():
        counted.get()
        counted.get()
        lin.weight.data = lin.weight.data.clone()  # the old storage is freed
        counted.get()
    assert counted.builds == 2


def test_extra_key_parts(lin):
    counted = Counted(lin)
    with torch.no_grad():
        for scale in (1.0, 1.0, 0.5, 0.5, 1.0):
            derived(lin, "double", [lin.weight], counted, extra=scale)
    assert counted.builds == 3


def test_a_key_part_by_values(lin):
    counted = Counted(lin)
    table = torch.randn(5, 3)
    with torch.no_grad():
        for t in (table, table, table.clone(), table + 1, table.double()):
            derived(lin, "double", [lin.weight], counted, extra=SameValues(t))
    assert counted.builds == 3  # the same tensor and an equal one match; other values or a dtype do not


def test_an_unrelated_change_does_not_rebuild(lin):
    counted = Counted(lin)
    with torch.no_grad():
        counted.get()
        derived(lin, "other", [lin.weight], lambda: lin.weight.sum())  # another name on the same owner
        torch.randn(4, 6).mul_(2.0)
        counted.get()
    assert counted.builds == 1
    assert set(kept(lin)) == {"double", "other"}


def test_modules_sharing_a_weight_each_follow_its_edits():
    a, b = Linear(6, 4).eval(), Linear(6, 4).eval()
    b.weight = a.weight
    ca, cb = Counted(a), Counted(b)
    with torch.no_grad():
        va, vb = ca.get(), cb.get()
        assert va is not vb and torch.equal(va, vb)
        a.weight.add_(1.0)
        assert torch.equal(cb.get(), a.weight * 2)
        assert torch.equal(ca.get(), a.weight * 2)
    assert (ca.builds, cb.builds) == (2, 2)


def test_autograd_builds_in_the_call_and_keeps_nothing(lin):
    counted = Counted(lin)
    value = counted.get()  # grad enabled, the weight requires grad
    assert value.requires_grad
    value.sum().backward()
    assert torch.equal(lin.weight.grad, torch.full_like(lin.weight, 2.0))
    counted.get()
    assert counted.builds == 2 and kept(lin) == ()
    lin.requires_grad_(False)  # frozen weights: nothing to differentiate, so the value is kept
    counted.get()
    counted.get()
    assert counted.builds == 3 and kept(lin) == ("double",)


def test_a_value_without_gradient_is_kept_under_autograd(lin):
    counted = Counted(lin)
    for _ in range(3):
        value = derived(lin, "double", [lin.weight], counted, differentiable=False)
    assert counted.builds == 1 and not value.requires_grad


def test_inference_mode_builds_ordinary_tensors(lin):
    with torch.inference_mode():
        value = row_major(lin, lin.weight)
    assert not value.is_inference() and not value.requires_grad
    assert value._version == 0  # usable as a source of another derived value


def test_row_major(lin):
    other = torch.randn(4, 3)
    with torch.no_grad():
        t = row_major(lin, lin.weight)
        assert t.is_contiguous() and torch.equal(t, lin.weight.t())
        assert row_major(lin, lin.weight) is t
        both = row_major(lin, lin.weight, other, name="both")
        assert both.is_contiguous() and torch.equal(both, torch.cat((lin.weight, other), 1).t())
        lin.weight.mul_(2.0)
        assert torch.equal(row_major(lin, lin.weight), lin.weight.t())


def test_copies_of_the_owner_start_without_values(lin):
    with torch.no_grad():
        row_major(lin, lin.weight)
    for copy in (copy_module.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
        assert kept(copy) == () and kept(lin) == ("row_major",)
        with torch.no_grad():
            assert torch.equal(row_major(copy, copy.weight), lin.weight.t())


def test_forget_and_the_owner_going():
    lin = Linear(6, 4)
    with torch.no_grad():
        row_major(lin, lin.weight)
        forget(lin)
        assert kept(lin) == ()
        value = row_major(lin, lin.weight)
    gone = weakref.ref(value)
    del lin, value
    gc.collect()
    assert gone() is None  # the owner held weakly, its values with it
