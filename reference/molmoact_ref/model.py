# SPDX-License-Identifier: Apache-2.0
"""MolmoAct2 inference in PyTorch fp32, module by module, with the parameter names of the released
checkpoints (docs/ARCHITECTURE.md "Weight names"). Written from the upstream HF remote code
(modeling_molmoact2.py) and the Grid Sampler's ActiveTokenSampler; every session of the C engine
has a method here with the same inputs and outputs.

Shapes in comments use: P patches per image (729), T pooled tokens per image (196), K sampled
tokens per image (16), S prompt tokens, D LLM width, L LLM layers, A action horizon (10),
Da max action dim (32).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import config as cfglib


def activation(name):
    if name in ("silu", "swish"):
        return F.silu
    if name == "gelu":
        return F.gelu
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    raise ValueError(f"unsupported activation {name!r}")


def attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d) + mask) v, as the sdpa math path computes it.
    q [..., Lq, d], k/v [..., Lk, d]; mask is boolean (True = attend) or additive float."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def rms_norm(x, eps=1e-6):
    """Weightless RMSNorm with fp32 statistics."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return self.weight * rms_norm(x, self.eps)


# =============================================================================== vision backbone

class VitAttention(nn.Module):
    """Multi-head dot-product attention of the ViT and of the 2x2 pooling (wq/wk/wv/wo, biased)."""

    def __init__(self, hidden, heads, kv_heads, head_dim, input_dim=None):
        super().__init__()
        input_dim = input_dim or hidden
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.wq = nn.Linear(input_dim, heads * head_dim)
        self.wk = nn.Linear(input_dim, kv_heads * head_dim)
        self.wv = nn.Linear(input_dim, kv_heads * head_dim)
        self.wo = nn.Linear(heads * head_dim, hidden)

    def forward(self, xq, xkv=None, mask=None):
        xkv = xq if xkv is None else xkv
        b, lq, lk = xq.shape[0], xq.shape[1], xkv.shape[1]
        q = self.wq(xq).view(b, lq, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(xkv).view(b, lk, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(xkv).view(b, lk, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = attention(q.float(), k.float(), v.float(), mask)
        return self.wo(out.transpose(1, 2).reshape(b, lq, self.heads * self.head_dim))


class VitMlp(nn.Module):
    def __init__(self, dim, hidden, act):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)
        self.act = activation(act)

    def forward(self, x):
        return self.w2(self.act(self.w1(x)))


class VitBlock(nn.Module):
    def __init__(self, v):
        super().__init__()
        self.attention = VitAttention(v["hidden_size"], v["num_attention_heads"],
                                      v["num_key_value_heads"], v["head_dim"])
        self.feed_forward = VitMlp(v["hidden_size"], v["intermediate_size"], v["hidden_act"])
        self.attention_norm = nn.LayerNorm(v["hidden_size"], eps=v["layer_norm_eps"])
        self.ffn_norm = nn.LayerNorm(v["hidden_size"], eps=v["layer_norm_eps"])

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class VitBlocks(nn.Module):
    def __init__(self, v, n):
        super().__init__()
        self.resblocks = nn.ModuleList([VitBlock(v) for _ in range(n)])


class VisionTransformer(nn.Module):
    def __init__(self, v, n_blocks):
        super().__init__()
        self.positional_embedding = nn.Parameter(torch.zeros(v["image_num_pos"], v["hidden_size"]))
        self.patch_embedding = nn.Linear(v["image_patch_size"] ** 2 * 3, v["hidden_size"])
        self.transformer = VitBlocks(v, n_blocks)

    def forward(self, pixels):
        """pixels [n, P, 588] -> (embedding [n, P, Dv], list of every block's output)"""
        x = self.patch_embedding(pixels) + self.positional_embedding[None]
        embed, outs = x, []
        for block in self.transformer.resblocks:
            x = block(x)
            outs.append(x)
        return embed, outs


class ProjectorMlp(nn.Module):
    """SwiGLU without biases: w2(act(w1 x) * w3 x)."""

    def __init__(self, dim, hidden, out, act):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, out, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.act = activation(act)

    def forward(self, x):
        return self.w2(self.act(self.w1(x)) * self.w3(x))


class ActiveTokenSampler(nn.Module):
    """Grid Sampler: a scout MLP predicts K (x, y) points in (0, 1) from the mean feature, the map
    is sampled there bilinearly (align_corners=False, zero padding) and a coordinate embedding is
    added. Hidden widths come from the checkpoint (512 and 256 upstream)."""

    def __init__(self, channels, num_tokens, scout_hidden=512, coord_hidden=256):
        super().__init__()
        self.num_tokens = num_tokens
        self.scout_mlp = nn.Sequential(nn.Linear(channels, scout_hidden), nn.ReLU(),
                                       nn.Linear(scout_hidden, 2 * num_tokens), nn.Sigmoid())
        self.coord_encoder = nn.Sequential(nn.Linear(2, coord_hidden), nn.ReLU(),
                                           nn.Linear(coord_hidden, channels))

    def forward(self, fmap, trace=None):
        """fmap [B, C, H, W] -> [B, K, C]"""
        b, c, h, w = fmap.shape
        if h != w:
            s = min(h, w)
            fmap = F.adaptive_avg_pool2d(fmap, (s, s))
            if trace is not None:
                trace["pooled_feature_map"] = fmap
        coords = self.scout_mlp(fmap.mean(dim=(2, 3))).view(b, self.num_tokens, 2)  # [...,0]=x
        grid = coords * 2.0 - 1.0
        sampled = F.grid_sample(fmap, grid.unsqueeze(1), mode="bilinear", padding_mode="zeros",
                                align_corners=False)  # [B, C, 1, K]
        coord_emb = self.coord_encoder(coords)
        if trace is not None:
            trace.update(global_feat=fmap.mean(dim=(2, 3)), pred_coords=coords, grid=grid.unsqueeze(1),
                         grid_sample_out=sampled, coord_emb=coord_emb)
        return sampled.squeeze(2).transpose(1, 2) + coord_emb


def pooling_index(ph, pw, pool_h=2, pool_w=2):
    """For each pooled token (row-major over the padded grid) the pool_h*pool_w patch indices it
    gathers, -1 where the patch grid was padded (padding split floor/ceil: top/left get the
    smaller half). Returns a LongTensor [T, pool_h*pool_w]."""
    hp = -(-ph // pool_h) * pool_h
    wp = -(-pw // pool_w) * pool_w
    top, left = (hp - ph) // 2, (wp - pw) // 2
    grid = torch.full((hp, wp), -1, dtype=torch.long)
    grid[top:top + ph, left:left + pw] = torch.arange(ph * pw).view(ph, pw)
    grid = grid.view(hp // pool_h, pool_h, wp // pool_w, pool_w).permute(0, 2, 1, 3)
    return grid.reshape(-1, pool_h * pool_w)


class VisionBackbone(nn.Module):
    def __init__(self, cfg, sampler=None):
        super().__init__()
        v, a = cfg["vit_config"], cfg["adapter_config"]
        self.cfg = cfg
        self.taps = cfglib.vit_layer_indices(cfg)
        self.image_vit = VisionTransformer(v, cfglib.vit_blocks_built(cfg))
        self.image_pooling_2d = VitAttention(a["hidden_size"], a["num_attention_heads"],
                                             a["num_key_value_heads"], a["head_dim"],
                                             input_dim=v["hidden_size"] * len(self.taps))
        self.image_projector = ProjectorMlp(a["hidden_size"], a["intermediate_size"],
                                            a["text_hidden_size"], a["hidden_act"])
        # sampler = None | dict(channels, num_tokens, scout_hidden, coord_hidden)
        self.sampler_placement = None
        if sampler is not None:
            self.token_sampler = ActiveTokenSampler(sampler["channels"], sampler["num_tokens"],
                                                    sampler["scout_hidden"], sampler["coord_hidden"])
            if sampler["channels"] == a["text_hidden_size"]:
                self.sampler_placement = "projector"   # samples the projected LLM-space grid
            elif sampler["channels"] == a["hidden_size"]:
                self.sampler_placement = "pooling"     # samples the pooled grid, then projects
            else:
                raise ValueError(f"token_sampler width {sampler['channels']} matches neither the "
                                 f"pooled ({a['hidden_size']}) nor the projected "
                                 f"({a['text_hidden_size']}) features")
        self.grid_hw = cfglib.pooled_grid(cfg)
        self.register_buffer("pool_idx", pooling_index(*cfglib.patch_grid(cfg)), persistent=False)

    def tokens_per_image(self):
        if self.sampler_placement is not None:
            return self.token_sampler.num_tokens
        return self.grid_hw[0] * self.grid_hw[1]

    def _sample(self, tokens, trace, key):
        """tokens [n, T, C] row-major over the pooled grid -> [n, K, C]"""
        n, _, c = tokens.shape
        h, w = self.grid_hw
        fmap = tokens.transpose(1, 2).reshape(n, c, h, w)
        local = {}
        out = self.token_sampler(fmap, trace=local)
        if trace is not None:
            trace[key + "_coords"] = local["pred_coords"]
        return out

    def forward(self, pixels, trace=None):
        """pixels [n, P, 588] (normalised to [-1, 1]) -> image features [n*K, D]"""
        # upstream canonicalises float pixels onto the uint8 grid before the ViT
        pixels = torch.clamp(torch.round((pixels.float() + 1.0) * 0.5 * 255.0), 0.0, 255.0) / 255.0 * 2.0 - 1.0
        embed, outs = self.image_vit(pixels)
        feats = torch.cat([outs[i] for i in self.taps], dim=-1)            # [n, P, C2]
        n = feats.shape[0]
        idx = self.pool_idx                                                 # [T, 4]
        valid = idx >= 0
        to_pool = feats[:, idx.clamp(min=0)] * valid[None, :, :, None].to(feats.dtype)  # [n,T,4,C2]
        to_pool = to_pool.reshape(-1, idx.shape[1], feats.shape[-1])
        if self.cfg["adapter_config"]["pooling_attention_mask"]:
            count = valid.sum(-1).clamp(min=1).to(feats.dtype).repeat(n)
            query = to_pool.sum(-2, keepdim=True) / count[:, None, None]
            mask = valid.repeat(n, 1)[:, None, None, :]
        else:
            query = to_pool.mean(-2, keepdim=True)
            mask = None
        pooled = self.image_pooling_2d(query, to_pool, mask=mask).view(n, idx.shape[0], -1)
        if trace is not None:
            trace.update(vit_embed=embed, vit_hidden=torch.stack(outs), vit_taps=feats,
                         pool_query=query.view(n * idx.shape[0], -1), pooled=pooled)
        x = pooled
        if self.sampler_placement == "pooling":
            x = self._sample(x, trace, "sample")
            if trace is not None:
                trace["sampled"] = x
        x = self.image_projector(x)
        if trace is not None:
            trace["projected"] = x
        if self.sampler_placement == "projector":
            x = self._sample(x, trace, "sample")
            if trace is not None:
                trace["sampled"] = x
        return x.reshape(-1, x.shape[-1])


# ======================================================================================== LLM

def rope_inv_freq(head_dim, theta):
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def llm_rope(positions, head_dim, theta):
    """cos, sin [S, head_dim] = cat(freqs, freqs) for the given integer positions."""
    freqs = torch.einsum("i,j->ij", positions.float(), rope_inv_freq(head_dim, theta))
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LlmAttention(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (t["num_attention_heads"], t["num_key_value_heads"],
                                                    t["head_dim"])
        self.qk_norm_type = t["qk_norm_type"] if t["use_qk_norm"] else None
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.att_proj = nn.Linear(t["hidden_size"], q_dim + 2 * kv_dim, bias=t["qkv_bias"])
        if self.qk_norm_type is not None:
            per_head = self.qk_norm_type == "qwen3"
            self.q_norm = RMSNorm(self.head_dim if per_head else q_dim, t["layer_norm_eps"])
            self.k_norm = RMSNorm(self.head_dim if per_head else kv_dim, t["layer_norm_eps"])
        self.attn_out = nn.Linear(q_dim, t["hidden_size"], bias=False)

    def forward(self, x, cos, sin, bias):
        """x [S, D] -> (out [S, D], k [S, kvh, hd] post-norm post-RoPE, v [S, kvh, hd])"""
        s = x.shape[0]
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = self.att_proj(x).split([q_dim, kv_dim, kv_dim], dim=-1)
        if self.qk_norm_type == "olmo":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(s, self.heads, self.head_dim)
        k = k.view(s, self.kv_heads, self.head_dim)
        v = v.view(s, self.kv_heads, self.head_dim)
        if self.qk_norm_type == "qwen3":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        group = self.heads // self.kv_heads
        kh = k.transpose(0, 1).repeat_interleave(group, dim=0)
        vh = v.transpose(0, 1).repeat_interleave(group, dim=0)
        out = attention(q.transpose(0, 1), kh, vh, bias[None])  # [H, S, hd]
        return self.attn_out(out.transpose(0, 1).reshape(s, q_dim)), k, v


class LlmMlp(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.ff_proj = nn.Linear(t["hidden_size"], 2 * t["intermediate_size"], bias=False)
        self.ff_out = nn.Linear(t["intermediate_size"], t["hidden_size"], bias=False)
        self.act = activation(t["hidden_act"])

    def forward(self, x):
        up, gate = self.ff_proj(x).chunk(2, dim=-1)   # OLMo order: the SECOND half is gated
        return self.ff_out(self.act(gate) * up)


class LlmBlock(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.norm_after = t["norm_after"]
        self.self_attn = LlmAttention(t)
        self.attn_norm = RMSNorm(t["hidden_size"], t["layer_norm_eps"])
        self.mlp = LlmMlp(t)
        self.ff_norm = RMSNorm(t["hidden_size"], t["layer_norm_eps"])

    def forward(self, x, cos, sin, bias):
        if self.norm_after:
            h, k, v = self.self_attn(x, cos, sin, bias)
            x = x + self.attn_norm(h)
            return x + self.ff_norm(self.mlp(x)), k, v
        h, k, v = self.self_attn(self.attn_norm(x), cos, sin, bias)
        x = x + h
        return x + self.mlp(self.ff_norm(x)), k, v


class WordEmbedding(nn.Module):
    def __init__(self, vocab, extra, dim):
        super().__init__()
        self.embedding = nn.Parameter(torch.zeros(vocab, dim))
        self.new_embedding = nn.Parameter(torch.zeros(extra, dim))

    def forward(self, ids):
        ids = ids * (ids != -1).to(ids.dtype)
        return F.embedding(ids, torch.cat([self.embedding, self.new_embedding], dim=0))


class RotaryBuffer(nn.Module):
    """Holds the checkpoint's persistent inv_freq buffer. Upstream rebuilds inv_freq from the
    config on first use (its cache starts empty), so the stored values are never used; we do the
    same and keep the buffer only so the key set matches."""

    def __init__(self, head_dim):
        super().__init__()
        self.register_buffer("inv_freq", torch.zeros(head_dim // 2), persistent=True)


class TextModel(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.t = t
        self.wte = WordEmbedding(t["vocab_size"], t["additional_vocab_size"], t["hidden_size"])
        self.blocks = nn.ModuleList([LlmBlock(t) for _ in range(t["num_hidden_layers"])])
        self.ln_f = RMSNorm(t["hidden_size"], t["layer_norm_eps"])
        self.rotary_emb = RotaryBuffer(t["head_dim"])


def llm_attention_bias(image_mask, valid=None):
    """Additive prefill mask [S, S]: key k visible from query q when valid[k] and (k <= q or both
    are image tokens); 0 where allowed, finfo(float32).min elsewhere."""
    s = image_mask.shape[0]
    img = image_mask.bool()
    allowed = torch.tril(torch.ones(s, s, dtype=torch.bool)) | (img[:, None] & img[None, :])
    if valid is not None:
        allowed &= valid.bool()[None, :]
    return torch.where(allowed, torch.tensor(0.0), torch.tensor(torch.finfo(torch.float32).min)), allowed


# ============================================================================== action expert

def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


def expert_rope(seq_len, head_dim, base=10000.0):
    """cos, sin [A, head_dim/2] for the expert's half-split RoPE."""
    half = head_dim // 2
    inv = 1.0 / (base ** (torch.arange(0, half, dtype=torch.float32) / max(half, 1)))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return freqs.cos(), freqs.sin()


def apply_expert_rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class ExpertSelfAttention(nn.Module):
    def __init__(self, e):
        super().__init__()
        self.heads = e["num_heads"]
        self.head_dim = e["hidden_size"] // e["num_heads"]
        self.qk_norm, self.eps, self.rope = e["qk_norm"], e["qk_norm_eps"], e["rope"]
        self.causal = e["causal_attn"]
        self.qkv = nn.Linear(e["hidden_size"], 3 * e["hidden_size"])
        self.out_proj = nn.Linear(e["hidden_size"], e["hidden_size"])

    def forward(self, x, rope):
        b, a, d = x.shape
        qkv = self.qkv(x).view(b, a, 3, self.heads, self.head_dim)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, A, hd]
        if self.qk_norm:
            q, k = rms_norm(q, self.eps), rms_norm(k, self.eps)
        if self.rope:
            q, k = apply_expert_rope(q, *rope), apply_expert_rope(k, *rope)
        mask = torch.tril(torch.ones(a, a, dtype=torch.bool)) if self.causal else None
        out = attention(q, k, v, mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, a, d))


class ExpertCrossAttention(nn.Module):
    def __init__(self, e):
        super().__init__()
        self.heads = e["num_heads"]
        self.head_dim = e["hidden_size"] // e["num_heads"]
        self.qk_norm, self.eps = e["qk_norm"], e["qk_norm_eps"]
        self.q_proj = nn.Linear(e["hidden_size"], e["hidden_size"])
        self.out_proj = nn.Linear(e["hidden_size"], e["hidden_size"])

    def forward(self, x, ctx_k, ctx_v, cross_bias):
        """ctx_k/ctx_v [B, S, H, hd]; cross_bias additive [B, S]"""
        b, a, d = x.shape
        q = self.q_proj(x).view(b, a, self.heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q = rms_norm(q, self.eps)
        mask = None if cross_bias is None else cross_bias[:, None, None, :]
        out = attention(q, ctx_k.transpose(1, 2), ctx_v.transpose(1, 2), mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, a, d))


class ExpertMlp(nn.Module):
    def __init__(self, e, inner):
        super().__init__()
        self.up_proj = nn.Linear(e["hidden_size"], inner)
        self.gate_proj = nn.Linear(e["hidden_size"], inner)
        self.down_proj = nn.Linear(inner, e["hidden_size"])

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Modulation(nn.Module):
    def __init__(self, dim, chunks):
        super().__init__()
        self.linear = nn.Linear(dim, chunks * dim)

    def forward(self, c):
        return self.linear(F.silu(c))


class ExpertBlock(nn.Module):
    def __init__(self, e, inner):
        super().__init__()
        self.self_attn = ExpertSelfAttention(e)
        self.cross_attn = ExpertCrossAttention(e)
        self.mlp = ExpertMlp(e, inner)
        self.modulation = Modulation(e["hidden_size"], 9)

    def forward(self, x, mod, ctx_k, ctx_v, cross_bias, rope):
        (shift_msa, scale_msa, gate_msa, shift_mca, scale_mca, gate_mca,
         shift_mlp, scale_mlp, gate_mlp) = mod
        x = x + gate_msa[:, None] * self.self_attn(modulate(rms_norm(x), shift_msa, scale_msa), rope)
        x = x + gate_mca[:, None] * self.cross_attn(modulate(rms_norm(x), shift_mca, scale_mca),
                                                    ctx_k, ctx_v, cross_bias)
        return x + gate_mlp[:, None] * self.mlp(modulate(rms_norm(x), shift_mlp, scale_mlp))


class FinalLayer(nn.Module):
    def __init__(self, dim, out):
        super().__init__()
        self.modulation = Modulation(dim, 2)
        self.linear = nn.Linear(dim, out)

    def forward(self, x, mod):
        shift, scale = mod
        return self.linear(modulate(rms_norm(x), shift, scale))


class SinusoidalTime(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, t):
        half = self.dim // 2
        freq = torch.exp(torch.arange(half, dtype=t.dtype) * (-math.log(10000.0) / max(half - 1, 1)))
        args = t[:, None] * freq[None, :]
        emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
        return F.pad(emb, (0, 1)) if self.dim % 2 else emb


class ActionExpert(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        e, t = cfg["action_expert_config"], cfg["text_config"]
        self.e = e
        d = e["hidden_size"]
        kv_dim = t["num_key_value_heads"] * t["head_dim"]
        inner = cfglib.expert_mlp_inner(cfg)
        self.time_embed = nn.Sequential(SinusoidalTime(e["timestep_embed_dim"]),
                                        nn.Linear(e["timestep_embed_dim"], d), nn.SiLU(),
                                        nn.Linear(d, d))
        self.action_embed = nn.Linear(cfg["max_action_dim"], d)
        self.context_k_proj = nn.Linear(kv_dim, d, bias=False)
        self.context_v_proj = nn.Linear(kv_dim, d, bias=False)
        self.blocks = nn.ModuleList([ExpertBlock(e, inner) for _ in range(e["num_layers"])])
        self.final_layer = FinalLayer(d, cfg["max_action_dim"])

    @property
    def head_dim(self):
        return self.e["hidden_size"] // self.e["num_heads"]

    def context(self, k, v):
        """action_context session: LLM K/V [L, S, kvh*hd] -> ctx_k, ctx_v [L, S, H, hde]."""
        lyr, s, _ = k.shape
        h, hd = self.e["num_heads"], self.head_dim
        ck, cv = self.context_k_proj(k), self.context_v_proj(v)
        if self.e["context_layer_norm"]:
            ck, cv = rms_norm(ck), rms_norm(cv)
        ck, cv = ck.view(lyr, s, h, hd), cv.view(lyr, s, h, hd)
        if self.e["qk_norm"]:
            ck = rms_norm(ck, self.e["qk_norm_eps"])   # the blocks' weightless cross_attn.k_norm
        return ck, cv

    def time_conditioning(self, t):
        """t [B] float32 -> c [B, d]"""
        c = self.time_embed[0](t)
        for layer in list(self.time_embed.children())[1:]:
            c = layer(c)
        return c

    def modulations(self, c):
        """per-block 9-tuples and the final (shift, scale) for conditioning c [B, d]"""
        blocks = [tuple(b.modulation(c).chunk(9, dim=1)) for b in self.blocks]
        return blocks, tuple(self.final_layer.modulation(c).chunk(2, dim=1))

    def step(self, x, t, ctx_k, ctx_v, cross_bias, trace=None):
        """action_step session: x [B, A, Da], t [B] -> velocity [B, A, Da].
        ctx_k/ctx_v [L, B, S, H, hde]; cross_bias [B, S] additive."""
        c = self.time_conditioning(t)
        block_mods, final_mod = self.modulations(c)
        rope = expert_rope(x.shape[1], self.head_dim) if self.e["rope"] else None
        h = self.action_embed(x)
        if trace is not None:
            trace["action_embed"] = h
            trace["block_out"] = []
            trace["time_cond"] = c
            trace["modulations"] = torch.stack([torch.stack(m, 1) for m in block_mods], 1)  # [B,L,9,d]
            trace["final_modulation"] = torch.stack(final_mod, 1)
        for l, block in enumerate(self.blocks):
            h = block(h, block_mods[l], ctx_k[l], ctx_v[l], cross_bias, rope)
            if trace is not None:
                trace["block_out"].append(h)
        return self.final_layer(h, final_mod)


# ================================================================================ whole model

class MolmoAct2Model(nn.Module):
    def __init__(self, cfg, sampler=None):
        super().__init__()
        self.transformer = TextModel(cfg["text_config"])
        self.vision_backbone = VisionBackbone(cfg, sampler)
        self.action_expert = ActionExpert(cfg)


class MolmoAct2(nn.Module):
    """Parameter names equal the HF checkpoint keys: model.transformer..., model.vision_backbone...,
    model.action_expert..., lm_head.weight (unused for continuous actions, kept for the key set)."""

    def __init__(self, cfg, sampler=None):
        super().__init__()
        self.cfg = cfg
        t = cfg["text_config"]
        self.model = MolmoAct2Model(cfg, sampler)
        self.lm_head = nn.Linear(t["hidden_size"], t["vocab_size"], bias=False)

    # ---- sessions ----------------------------------------------------------------------------
    def vision(self, pixels, trace=None):
        return self.model.vision_backbone(pixels, trace)

    def embed(self, input_ids, image_features):
        """wte lookup, then image features ADDED at the <im_patch> rows."""
        x = self.model.transformer.wte(input_ids)
        patch = input_ids == self.cfg["image_patch_id"]
        if int(patch.sum()) != image_features.shape[0]:
            raise ValueError(f"prompt has {int(patch.sum())} <im_patch> tokens but vision produced "
                             f"{image_features.shape[0]} features")
        x = x.clone()
        x[patch] = x[patch] + image_features
        return x

    def llm_layers(self, hidden, first, last, image_mask, positions, valid=None):
        """llm_split session: layers [first, last) -> (hidden [S, D], k, v [n, S, kvh, hd]);
        valid [S] (optional): keys hidden from every query where False (left padding)"""
        t = self.cfg["text_config"]
        cos, sin = llm_rope(positions, t["head_dim"], t["rope_theta"])
        bias, _ = llm_attention_bias(image_mask, valid)
        ks, vs = [], []
        for block in self.model.transformer.blocks[first:last]:
            hidden, k, v = block(hidden, cos, sin, bias)
            ks.append(k)
            vs.append(v)
        return hidden, torch.stack(ks), torch.stack(vs)


def encoder_mask(cfg, input_ids):
    """Cross-attention key mask [S] (True = visible): ids != -1; under action_mode 'both' also
    hide every eos id (the inserted BOS and the <|im_end|> closing the user turn) and any
    <action_start>..<action_end> span (to the end if unterminated)."""
    mask = input_ids != -1
    if cfg["action_mode"] != "both" or cfg.get("molmoact_encoder_mask") == "prompt":
        return mask
    mask = mask & (input_ids != int(cfg["eos_token_id"]))
    start_id, end_id = cfg["action_start_token_id"], cfg["action_end_token_id"]
    if start_id is not None and end_id is not None:
        # each start pairs with the first unused end at or after it (upstream's two pointers)
        ids = input_ids.tolist()
        starts = [i for i, x in enumerate(ids) if x == start_id]
        ends = [i for i, x in enumerate(ids) if x == end_id]
        e = 0
        for s in starts:
            while e < len(ends) and ends[e] < s:
                e += 1
            if e >= len(ends):
                mask[s:] = False
                break
            mask[s:ends[e] + 1] = False
            e += 1
    return mask


def image_token_mask(cfg, input_ids):
    """token_type_ids: 1 for every image-structure token (patch, col, start, low-res start, frame
    start/end, end, low-res patch); these attend to each other bidirectionally."""
    ids = [cfg[k] for k in ("image_patch_id", "image_col_id", "image_start_token_id",
                            "low_res_image_start_token_id", "frame_start_token_id",
                            "image_end_token_id", "frame_end_token_id", "image_low_res_id")
           if cfg.get(k) is not None]
    return torch.isin(input_ids, torch.tensor(ids, dtype=input_ids.dtype))
