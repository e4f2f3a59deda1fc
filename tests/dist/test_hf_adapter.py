"""The Hugging Face adapter computes what the library's own model computes.

Tiny models built from configs: the planner layers' loss, logits and gradients equal
``AutoModelForCausalLM``'s on the same batch (fp32); the planner's shape (from config.json)
counts exactly the adapter's parameters; pretrained weights load per layer and an export loads
back with ``from_pretrained`` with equal logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_tiny import SEQ, VOCAB, hf_model, make_folder

from orchestrator.models.hf_causal import HFCausalLM, hf_model_spec
from orchestrator.models.hf_export import export_hf
from orchestrator.worker.layers import build_layers
from orchestrator.worker.tied import copy_initial_weights, sum_local, unique_parameters

KINDS = ["gpt2", "llama", "llama-tied", "mistral"]


def _adapter(folder: Path, pretrained: bool | None = None) -> tuple[HFCausalLM, dict]:
    model = HFCausalLM(folder, SEQ, pretrained=pretrained)
    layers = build_layers(model, range(model.num_planner_layers), 0, torch.device("cpu"))
    copy_initial_weights(model, layers, 0, torch.device("cpu"))
    return model, layers


def _forward(model: HFCausalLM, layers: dict, ids: torch.Tensor) -> torch.Tensor:
    out = ids
    for i in range(model.num_planner_layers):
        out = layers[i](out)
    return out


def _to_hf(model: HFCausalLM, layers: dict) -> dict[str, torch.Tensor]:
    return {
        hf: p
        for i, layer in layers.items()
        for local, hf in model.hf_names(i, [n for n, _ in layer.named_parameters()]).items()
        for n, p in layer.named_parameters()
        if n == local
    }


@pytest.mark.parametrize("kind", KINDS)
def test_loss_and_gradients_equal_the_library_model(kind: str, tmp_path: Path) -> None:
    folder = make_folder(tmp_path, kind)
    model, layers = _adapter(folder)
    reference = hf_model(folder)
    # The library's model takes the adapter's initial weights (tied copies are equal).
    state = {k: v.detach().clone() for k, v in _to_hf(model, layers).items()}
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)

    window = torch.randint(0, VOCAB, (3, SEQ + 1), generator=torch.Generator().manual_seed(1))
    inputs, targets = window[:, :-1], window[:, 1:]
    logits = _forward(model, layers, inputs)
    loss = model.loss(logits, targets)
    loss.backward()
    sum_local(model, layers)

    # Labels are shifted inside the library's loss: its loss over SEQ+1 tokens is ours over SEQ.
    ref = reference(input_ids=window, labels=window)
    ref.loss.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.loss.detach()), rel=1e-6)
    assert torch.allclose(logits, ref.logits[:, :-1], atol=1e-5)

    ref_params = dict(reference.named_parameters())
    compared = 0
    for name, p in _to_hf(model, layers).items():
        if name not in ref_params:
            continue  # a tied head: the library has one matrix, compared as the embedding
        g_ref = ref_params[name].grad
        assert g_ref is not None, name
        assert torch.allclose(p.grad, g_ref, rtol=1e-4, atol=1e-6), name
        compared += 1
    assert compared == len(ref_params)
    if model.tied:
        (e_layer, e_name), (h_layer, h_name) = model.tied_parameters[0]
        emb = layers[e_layer].get_parameter(e_name)
        head = layers[h_layer].get_parameter(h_name)
        assert torch.equal(emb.grad, head.grad)


@pytest.mark.parametrize("kind", KINDS)
def test_planner_shape_counts_the_adapter_parameters(kind: str, tmp_path: Path) -> None:
    folder = make_folder(tmp_path, kind)
    model, layers = _adapter(folder)
    spec = hf_model_spec(model)
    for i in range(model.num_planner_layers):
        counted = sum(p.numel() for p in unique_parameters(model, layers, [i]))
        assert spec.layer_params(i) == counted, (i, spec.layer_params(i), counted)
    assert spec.total_params == hf_model(folder).num_parameters()
    if kind != "gpt2":
        assert spec.gated_mlp and spec.num_kv_heads == 2 and spec.positions.value == "rotary"


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_pretrained_weights_load_per_layer_and_export_round_trips(
    kind: str, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    folder = make_folder(tmp_path, kind, weights=True, seed=3)
    model, layers = _adapter(folder)
    assert model.pretrained
    reference = hf_model(folder)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = _forward(model, layers, ids)
        assert torch.allclose(ours, reference(input_ids=ids).logits, atol=1e-5)
        # Change the weights (as training would), export, load with the library.
        for layer in layers.values():
            for p in layer.parameters():
                p.add_(0.01 * torch.randn_like(p))
        copy_initial_weights(model, layers, 0, torch.device("cpu"))  # keep a tied copy equal
        trained = _forward(model, layers, ids)
    out = export_hf(model, {i: m.state_dict() for i, m in layers.items()}, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="sdpa").eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, trained, atol=1e-5)
    assert not torch.allclose(trained, ours, atol=1e-3)  # the export carries the new weights


def test_a_stage_reads_only_its_own_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors

    folder = make_folder(tmp_path, "llama", weights=True)
    model = HFCausalLM(folder, SEQ)
    read: list[str] = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.inner = real_open(*args, **kwargs)

        def __enter__(self) -> Spy:
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.__exit__(*exc)

        def keys(self) -> list[str]:
            return list(self.inner.keys())

        def get_tensor(self, key: str) -> torch.Tensor:
            read.append(key)
            return self.inner.get_tensor(key)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    model.build_layer(2)
    assert read and all(k.startswith("model.layers.1.") for k in read), read


def test_seeded_dropout_is_the_same_whatever_the_microbatches(tmp_path: Path) -> None:
    """GPT-2 with its configured dropout (0.1): the whole batch in one microbatch and the same
    batch in microbatches of 1 and 3 get the same masks, loss and gradients; masks change with
    the step, and dropout is really on."""
    from orchestrator.worker.dropout import sample_streams

    folder = make_folder(tmp_path, "gpt2")
    model = HFCausalLM(folder, SEQ, dropout=True)
    assert model.dropout

    def run(step: int, sizes: list[int]) -> tuple[torch.Tensor, float, dict]:
        layers = build_layers(model, range(model.num_planner_layers), 0, torch.device("cpu"))
        copy_initial_weights(model, layers, 0, torch.device("cpu"))
        window = torch.randint(0, VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(1))
        outs, total = [], 0.0
        with sample_streams(0, step, 0, sizes):
            for x, y in zip(
                torch.split(window[:, :-1], sizes), torch.split(window[:, 1:], sizes), strict=True
            ):
                out = x
                for i in range(model.num_planner_layers):
                    out = layers[i](out)
                loss = model.loss(out, y) * (x.shape[0] / 4)
                loss.backward()
                outs.append(out.detach())
                total += float(loss.detach())
        grads = {(i, n): p.grad.clone() for i, m in layers.items() for n, p in m.named_parameters()}
        return torch.cat(outs), total, grads

    whole, loss_whole, grads_whole = run(3, [4])
    split, loss_split, grads_split = run(3, [1, 3])
    assert torch.allclose(whole, split, atol=1e-5)
    assert loss_split == pytest.approx(loss_whole, rel=1e-6)
    for key, g in grads_whole.items():
        assert torch.allclose(g, grads_split[key], rtol=1e-4, atol=1e-6), key
    other_step, _, _ = run(4, [4])
    assert not torch.allclose(whole, other_step, atol=1e-3)
    # Against the same weights without dropout (eval mode switches it off).
    layers = build_layers(model, range(model.num_planner_layers), 0, torch.device("cpu"))
    copy_initial_weights(model, layers, 0, torch.device("cpu"))
    window = torch.randint(0, VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = window[:, :-1]
        for i in range(model.num_planner_layers):
            out = layers[i].eval()(out)
    assert not torch.allclose(whole, out, atol=1e-3)
