"""troupe.kv in one process: MXNet's KVStore calls on a "local" store, with numpy arrays and torch
tensors, the optimizers, and the errors."""
import numpy as np
import pytest
import torch

import troupe

EPS32 = np.finfo(np.float32).eps


def test_a_push_without_optimizer_becomes_the_value_and_a_list_is_summed():
    kv = troupe.kv.create("local")
    assert (kv.type, kv.rank, kv.num_workers) == ("local", 0, 1)
    kv.init(3, np.zeros((2, 3)))
    kv.push(3, [np.full((2, 3), 1.5), np.arange(6.0).reshape(2, 3)])  # two devices' arrays
    out = np.empty((2, 3), dtype=np.float32)
    kv.pull(3, out=out)
    np.testing.assert_array_equal(out, 1.5 + np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(kv.pull(3), out)  # no out: the value, returned


def test_string_and_list_keys_and_torch_tensors_in_and_out():
    kv = troupe.kv.create("local")
    kv.init(["w", "b"], [torch.ones(4), torch.zeros(2, 2)])
    kv.push(["w", "b"], [torch.full((4,), 2.0), torch.full((2, 2), 3.0)])
    w, b = torch.empty(4), torch.empty(2, 2, dtype=torch.float64)  # another dtype: converted
    kv.pull(["w", "b"], out=[w, b])
    assert torch.equal(w, torch.full((4,), 2.0))
    assert torch.equal(b, torch.full((2, 2), 3.0, dtype=torch.float64))
    outs = [np.empty(4, np.float32), np.empty(4, np.float32)]
    kv.pull("w", out=outs)  # every out of a key's list gets the value
    for o in outs:
        np.testing.assert_array_equal(o, np.full(4, 2.0))


def test_sgd_with_momentum_on_the_store_is_torch_optims():
    # PyTorch's SGD (troupe's semantics) in float64 as the reference: troupe's float32 steps
    # differ from it by their roundings, each step's w and v within a few float32 ulps of their
    # magnitude (2 multiply-adds a step), so 10 steps stay within 10 * 4 * eps32 * max|w|.
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(1000).astype(np.float32)
    grads = [rng.standard_normal(1000).astype(np.float32) for _ in range(10)]
    kv = troupe.kv.create("local")
    kv.init(0, w0)
    kv.set_optimizer(troupe.optimizer.create("sgd", learning_rate=0.1, momentum=0.9,
                                             rescale_grad=0.5))
    for g in grads:
        kv.push(0, g)
    w = kv.pull(0)
    ref = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9)
    for g in grads:
        ref.grad = 0.5 * torch.tensor(g, dtype=torch.float64)
        opt.step()
    ref = ref.detach().numpy()
    bound = 10 * 4 * EPS32 * np.abs(ref).max()
    assert np.abs(w - ref).max() <= bound


def test_adam_by_mxnets_names():
    opt = troupe.optimizer.create("adam", learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-6,
                                  wd=0.0)
    kv = troupe.kv.create("local")
    kv.init(1, np.ones(8))
    kv.set_optimizer(opt)
    kv.push(1, np.full(8, 0.5))
    # Adam's first step moves each weight by lr * g / (|g| + eps') = lr (to within eps' / |g|).
    np.testing.assert_allclose(kv.pull(1), np.full(8, 1 - 0.01), rtol=0, atol=1e-6)


def test_errors_name_the_culprit():
    kv = troupe.kv.create("local")
    kv.init(0, np.zeros(3))
    with pytest.raises(ValueError, match="a value of 4 numbers, but the key holds 3"):
        kv.push(0, np.zeros(4))
    with pytest.raises(troupe.Error, match="key 7 was never initialised"):
        kv.pull(7)
    with pytest.raises(TypeError, match="unknown parameter 'lerning_rate'"):
        troupe.optimizer.create("sgd", lerning_rate=0.1)
    with pytest.raises(TypeError, match="clip_gradient"):
        troupe.optimizer.create("sgd", clip_gradient=1.0)
    with pytest.raises(NotImplementedError, match="row_sparse_pull"):
        kv.row_sparse_pull(0, row_ids=np.array([0]))
    with pytest.raises(troupe.Error) as e:
        troupe.kv.create("bogus")
    assert e.value.kind == "input"
    assert "bogus" in str(e.value)
    with pytest.raises(troupe.Error) as e:
        kv.set_optimizer(troupe.optimizer.create("nosuch"))
    assert "nosuch" in str(e.value)


def test_a_pull_into_a_strided_out_writes_it_in_place():
    kv = troupe.kv.create("local")
    kv.init(0, np.arange(6.0))
    out = np.zeros((2, 6), dtype=np.float32)[:, ::2]  # a view with strides: 6 numbers
    kv.pull(0, out=out)
    np.testing.assert_array_equal(out, np.arange(6.0).reshape(2, 3))


def test_optimizer_states_saved_and_loaded_go_on_as_if_never_stopped(tmp_path):
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal(50).astype(np.float32)
    grads = [rng.standard_normal(50).astype(np.float32) for _ in range(6)]
    adam = troupe.optimizer.create("adam", learning_rate=0.01)

    def store(value):
        kv = troupe.kv.create("local")
        kv.init(["w", "unpushed"], [value, np.zeros(3)])
        kv.set_optimizer(adam)
        return kv

    whole = store(w0)
    for g in grads:
        whole.push("w", g)
    first = store(w0)
    for g in grads[:3]:
        first.push("w", g)
    path = tmp_path / "states"
    first.save_optimizer_states(path)
    second = store(first.pull("w"))  # the weights come with the run; the states from the file
    second.load_optimizer_states(path)
    for g in grads[3:]:
        second.push("w", g)
    # The same float32 operations in the same order as the run never stopped: the same bits.
    np.testing.assert_array_equal(second.pull("w"), whole.pull("w"))


def test_optimizer_states_refused_where_they_do_not_fit(tmp_path):
    path = tmp_path / "states"
    kv = troupe.kv.create("local")
    kv.init(0, np.ones(4))
    with pytest.raises(troupe.Error, match="no optimizer"):
        kv.save_optimizer_states(path)
    kv.set_optimizer(troupe.optimizer.create("adam"))
    kv.push(0, np.ones(4))
    kv.save_optimizer_states(path)
    other = troupe.kv.create("local")
    other.init(0, np.ones(4))
    other.set_optimizer(troupe.optimizer.create("sgd", momentum=0.9))
    with pytest.raises(troupe.Error, match="the states are adam's, and this store's optimizer is "
                                           "sgd"):
        other.load_optimizer_states(path)
    bigger = troupe.kv.create("local")
    bigger.init(0, np.ones(5))
    bigger.set_optimizer(troupe.optimizer.create("adam"))
    with pytest.raises(troupe.Error, match="its key 0 of 4 values is not this store's key 0 of 5"):
        bigger.load_optimizer_states(path)
    with pytest.raises(troupe.Error) as e:
        bigger.load_optimizer_states(tmp_path / "missing")
    assert e.value.kind == "io" and "missing" in str(e.value)
    (tmp_path / "garbage").write_bytes(b"not a states file at all")
    with pytest.raises(troupe.Error, match="not a file of save_optimizer_states"):
        bigger.load_optimizer_states(tmp_path / "garbage")


def test_values_of_other_float_types_convert_and_integers_are_refused_naming_the_key():
    kv = troupe.kv.create("local")
    kv.init("h", np.ones(4, dtype=np.float16))
    kv.push("h", torch.full((4,), 2.5, dtype=torch.bfloat16))
    np.testing.assert_array_equal(kv.pull("h"), np.full(4, 2.5))
    with pytest.raises(TypeError, match="push of key 'h': an array of int64; troupe's stores hold "
                                        "float32"):
        kv.push("h", np.ones(4, dtype=np.int64))
    with pytest.raises(TypeError, match="init of key 'n': a torch tensor of torch.int32"):
        kv.init("n", torch.ones(3, dtype=torch.int32))


def test_a_closed_store_refuses_every_call():
    kv = troupe.kv.create("local")
    kv.init(0, np.zeros(2))
    kv.close()
    for call in (lambda: kv.rank, lambda: kv.type, lambda: kv.pull(0), lambda: kv.barrier(),
                 lambda: kv.push(0, np.zeros(2))):
        with pytest.raises(troupe.Error, match="this KVStore was closed"):
            call()
    kv.close()  # a second close does nothing
