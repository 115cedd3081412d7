"""A Hugging Face transformers MoE model whose experts come from expertd instead of its memory.

``load_qwen3moe(core_gguf, client)`` builds transformers' ``Qwen3MoeForCausalLM`` for the core GGUF
of an expert pack (``expert-pack build`` writes it): the dense weights (embeddings, attention,
norms, routers, output) are read from the core GGUF and dequantized to float32 once; the experts
are never held. Each sparse MoE block is an :class:`ExpertdMoE`, which routes the tokens with the
model's own router, acquires the union of the chosen experts from expertd (``Client.acquire``),
runs each expert from its slot as it becomes ready (dequantized by the kernels' dequantizers),
hands it back (``Lease.done``) and adds the results in the order transformers' own block does.

``serve_experts(model, client)`` does the same for a transformers MoE model built elsewhere (its
sparse blocks must have ``gate`` returning ``(logits, weights, indices)`` as transformers 5's
Qwen3-MoE router does, and ``experts``); their expert weights are dropped.

Needs ``torch``, ``transformers`` (5.x) and, for ``load_qwen3moe``, ``gguf`` (llama.cpp's reader).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from . import Client, Error, dequantize

__all__ = ["ExpertdMoE", "serve_experts", "load_qwen3moe"]

_F32, _F16 = 0, 1


class ExpertdMoE(nn.Module):
    """A sparse MoE block whose experts live in expertd: route, acquire the union, run each
    expert as it is ready (SwiGLU: down(act(gate x) * up x)), hand it back, add the results.

    ``router`` is the model's own router module (called as ``router(x) -> (logits, weights,
    indices)``); ``pack_layer`` the expert pack's layer for this block. The arithmetic per expert
    is transformers' ``Qwen3MoeExperts``: gate and up as one matrix, the routing weight applied
    after down, the experts' results added in ascending expert order, so the output does not
    depend on the order in which expertd finishes reading them."""

    def __init__(self, client: Client, pack_layer: int, router: nn.Module,
                 act: Optional[Any] = None) -> None:
        super().__init__()
        self.client = client
        self.pack_layer = int(pack_layer)
        self.gate = router
        self.act = act if act is not None else F.silu
        info = client.info
        if not 0 <= self.pack_layer < len(info["layers"]):
            raise Error(f"no pack layer {pack_layer} (the pack has {len(info['layers'])} MoE layers)")
        self._roles = {r["role"]: r for r in info["layers"][self.pack_layer]["roles"]}
        for need in ("gate", "up", "down"):
            if need not in self._roles:
                raise Error(f"pack layer {pack_layer} has no '{need}' role "
                            f"({', '.join(self._roles)}): ExpertdMoE runs separate gate/up/down experts")
        self.acquired = 0  # experts acquired by this block (for reports)

    @staticmethod
    def _dequantize(raw: np.ndarray, r: Dict[str, Any], out: np.ndarray) -> None:
        if r["type"] == _F32:
            out[...] = raw.view(np.float32).reshape(out.shape)
        elif r["type"] == _F16:
            out[...] = raw.view(np.float16).reshape(out.shape)
        else:
            dequantize(raw, r["type"], out.shape, out=out)

    def _weights(self, lease: Any, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Expert i's gate and up rows as one (2 x ff, d) float32 matrix (as transformers keeps
        them), and its down rows: dequantized out of the slot (copies: it can go back at once)."""
        slot = lease.view(i)
        g, u, d = self._roles["gate"], self._roles["up"], self._roles["down"]
        part = lambda r: slot[r["offset"]:r["offset"] + r["bytes"]]  # noqa: E731
        gate_up = np.empty((g["shape"][0] + u["shape"][0], g["shape"][1]), np.float32)
        self._dequantize(part(g), g, gate_up[:g["shape"][0]])
        self._dequantize(part(u), u, gate_up[g["shape"][0]:])
        down = np.empty(tuple(d["shape"]), np.float32)
        self._dequantize(part(d), d, down)
        del slot  # the slot's array: done() needs it gone
        return torch.from_numpy(gate_up), torch.from_numpy(down)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        _, weights, indices = self.gate(x)
        experts: List[int] = torch.unique(indices).tolist()
        results: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        with torch.no_grad(), self.client.acquire(self.pack_layer, experts) as lease:
            while True:
                i = lease.next_ready()
                if i is None:
                    break
                e = experts[i]
                gate_up, down = self._weights(lease, i)
                lease.done(i)  # its slot goes back: the next wave of a large union may come
                pos, tok = torch.where(indices.T == e)
                g, u = F.linear(x[tok], gate_up).chunk(2, dim=-1)
                y = F.linear(self.act(g) * u, down) * weights[tok, pos, None]
                results[e] = (tok, y)
        self.acquired += len(experts)
        out = torch.zeros_like(x)
        for e in experts:  # ascending, as transformers' own experts loop
            tok, y = results[e]
            out.index_add_(0, tok, y.to(out.dtype))
        return out.reshape(shape)


def _pack_layers(client: Client) -> Dict[int, int]:
    """model layer -> pack layer."""
    return {int(l["model_layer"]): i for i, l in enumerate(client.info["layers"])}


def serve_experts(model: nn.Module, client: Client) -> List[ExpertdMoE]:
    """Replaces each sparse MoE block of a transformers model (a module with ``gate`` and
    ``experts``, under ``model.model.layers[i].mlp``) by an :class:`ExpertdMoE` taking that
    layer's experts from expertd; returns the new blocks. The model's expert weights are dropped."""
    layers = _pack_layers(client)
    blocks = []
    decoder = model.model.layers if hasattr(model, "model") else model.layers
    for li, layer in enumerate(decoder):
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not (hasattr(mlp, "gate") and hasattr(mlp, "experts")):
            continue
        if li not in layers:
            raise Error(f"model layer {li} is a MoE layer but the pack has no experts for it")
        act = getattr(mlp.experts, "act_fn", None)
        layer.mlp = ExpertdMoE(client, layers[li], mlp.gate, act)
        blocks.append(layer.mlp)
    if not blocks:
        raise Error("the model has no sparse MoE blocks (modules with 'gate' and 'experts')")
    return blocks


def _gguf_fields(reader: Any) -> Dict[str, Any]:
    out = {}
    for name, f in reader.fields.items():
        if not f.types:
            continue
        try:
            out[name] = f.contents()
        except Exception:  # noqa: BLE001 (a field type this reader version cannot decode)
            pass
    return out


def _gguf_tensor(t: Any) -> torch.Tensor:
    """float32 (ne1, ne0) or (ne0,) of a GGUF tensor, dequantized by the kernels."""
    dims = tuple(int(d) for d in reversed(list(t.shape)))  # (ne1, ne0)
    ttype = int(t.tensor_type)
    if ttype == _F32:
        w = np.array(t.data, dtype=np.float32).reshape(dims)
    elif ttype == _F16:
        w = np.asarray(t.data).astype(np.float32).reshape(dims)
    else:
        w = dequantize(np.asarray(t.data), ttype, dims if len(dims) == 2 else (dims[0],))
    return torch.from_numpy(np.ascontiguousarray(w))


def load_qwen3moe(core_gguf: str, client: Client, dtype: torch.dtype = torch.float32) -> nn.Module:
    """transformers' ``Qwen3MoeForCausalLM`` for an expert pack's core GGUF, its sparse blocks
    served by ``client`` (an :class:`ExpertdMoE` per MoE layer) and no expert weights held."""
    import gguf  # llama.cpp's reader (PyPI: gguf)
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    reader = gguf.GGUFReader(core_gguf)
    kv = _gguf_fields(reader)
    arch = kv.get("general.architecture")
    if arch != "qwen3moe":
        raise Error(f"{core_gguf}: architecture {arch!r}; load_qwen3moe reads qwen3moe "
                    "(for another transformers MoE model, build it and call serve_experts)")
    info = client.info
    if info["arch"] != arch:
        raise Error(f"expertd serves a {info['arch']} pack, not this {arch} model")
    tensors = {t.name: t for t in reader.tensors}
    a = lambda k, d=None: kv.get(f"{arch}.{k}", d)  # noqa: E731
    n_embd, n_head = int(a("embedding_length")), int(a("attention.head_count"))
    vocab = int(tensors["token_embd.weight"].shape[1])
    n_layer = int(a("block_count"))
    if int(a("expert_count")) != info["n_experts"]:
        raise Error(f"{core_gguf} has {a('expert_count')} experts per layer; expertd serves "
                    f"{info['n_experts']}: not this model's pack")
    cfg = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=n_embd, num_hidden_layers=n_layer,
        num_attention_heads=n_head, num_key_value_heads=int(a("attention.head_count_kv", n_head)),
        head_dim=int(a("attention.key_length", n_embd // n_head)),
        intermediate_size=int(a("feed_forward_length", a("expert_feed_forward_length"))),
        moe_intermediate_size=int(a("expert_feed_forward_length")),
        num_experts=int(a("expert_count")), num_experts_per_tok=int(a("expert_used_count")),
        norm_topk_prob=True, rms_norm_eps=float(a("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(a("context_length", 4096)),
        rope_parameters={"rope_type": "default", "rope_theta": float(a("rope.freq_base", 10000.0))},
        tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
        mlp_only_layers=[], decoder_sparse_step=1)

    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(cfg)
    serve_experts(model, client)  # the experts' (meta) parameters go with their blocks
    model.to_empty(device="cpu")
    with torch.device("cpu"):  # non-persistent buffers (RoPE's inverse frequencies) anew
        model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)

    names = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
                 "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                 "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
                 "ffn_gate_inp": "mlp.gate"}
    for i in range(n_layer):
        for g, h in per_layer.items():
            names[f"blk.{i}.{g}.weight"] = f"model.layers.{i}.{h}.weight"
    state = {}
    for g, h in names.items():
        if g not in tensors:
            if g == "output.weight":  # tied: the output is the embeddings
                continue
            raise Error(f"{core_gguf} lacks {g}")
        state[h] = _gguf_tensor(tensors[g]).to(dtype)
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise Error(f"weights do not fit transformers' Qwen3-MoE: missing {missing[:4]}, "
                    f"unexpected {unexpected[:4]}")
    return model.to(dtype).eval()
