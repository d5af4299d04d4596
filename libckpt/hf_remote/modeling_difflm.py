# dlm's masked-diffusion language model for transformers, written by `dlm-ckpt convert --to hf` beside
# the weights and loaded through config.json's auto_map with trust_remote_code=True, so that MegaDLMs'
# inference script (examples/dlm_generation/dlm_inference.py) runs dlm's exports:
#
#   model = AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)
#   x = model.generate(input_ids, attention_mask=..., max_new_tokens=G, sample_steps=S,
#                      inference_block_size=K, remasking="low_confidence", temperature=0.0, cfg=0.0)
#
# The network is Qwen3's (Llama's without q/k norms) with bidirectional attention; the parameter names
# are those of the plain Qwen3/Llama export, so the same safetensors load either way. generate() is the
# reverse process of dlm-generate (libtrain/sample/diffusion_sampler.cpp, docs/generation.md), decision
# for decision:
#   x = left-padded prompt + G mask tokens; padding is never attended; position ids = cumsum(attention) - 1.
#   Blocks of K positions left to right; a block's n masked positions are unmasked over S / (G / K) steps,
#   n // steps per step and one more in the first n % steps steps. Each step:
#     logits = f(x) in fp32; cfg w > 0: u = f(x with the prompt masked), logits = u + (w + 1)(logits - u)
#     x0 = argmax (T = 0; the first maximum), else argmax(top_p(logits) - T log(-log U)) in float64
#     confidence = softmax(logits)[x0] in float64 (low_confidence) or U (random); -inf after the block
#          and where x is not a mask
#     the k most confident positions of each row take x0 (ties: the lower position first).
#   U is dlm's Philox4x32-10 stream addressed by (seed, step, row, position, vocabulary id), so a seed
#   gives dlm-generate's tokens at T > 0 and with random remasking too.
# The whole sequence (prompt and generation) is returned, as MegaDLMs' generate does.
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_difflm import DiffLMConfig


class DiffLMRMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class DiffLMRotary(nn.Module):
    """RoPE, halves rotated (not interleaved): cos/sin of position * base^(-2i/d)."""

    def __init__(self, config):
        super().__init__()
        self.head_dim, self.base = config.head_dim, config.rope_theta

    def forward(self, x, position_ids):
        # Computed per call, not held as a buffer: transformers 5 builds models on the meta device and
        # leaves a non-persistent buffer made in __init__ uninitialized.
        d = self.head_dim
        inv_freq = 1.0 / (self.base ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).float() / d))
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class DiffLMAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.is_causal = config.attn_mask_type == "causal"
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)
        if config.qk_layernorm:
            self.q_norm = DiffLMRMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = DiffLMRMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, h, cos, sin, key_mask, additive_mask):
        b, n, _ = h.shape
        q = self.q_proj(h).view(b, n, self.heads, self.head_dim)
        k = self.k_proj(h).view(b, n, self.kv_heads, self.head_dim)
        v = self.v_proj(h).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.config.qk_layernorm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        impl = getattr(self.config, "_attn_implementation", None) or "eager"
        if impl not in ("eager", "sdpa"):
            # flash_attention_2 and other registered kernels: transformers' own wrappers, which read
            # is_causal from this module and take the 2D padding mask.
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
            out, _ = ALL_ATTENTION_FUNCTIONS[impl](self, q, k, v, key_mask, dropout=0.0, scaling=self.scaling)
            return self.o_proj(out.reshape(b, n, -1))
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask, scale=self.scaling)
        else:
            w = torch.matmul(q, k.transpose(2, 3)) * self.scaling + additive_mask
            out = torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class DiffLMMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DiffLMDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = DiffLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DiffLMAttention(config, layer_idx)
        self.post_attention_layernorm = DiffLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DiffLMMLP(config)

    def forward(self, h, cos, sin, key_mask, additive_mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, key_mask, additive_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DiffLMPreTrainedModel(PreTrainedModel):
    config_class = DiffLMConfig
    base_model_prefix = "model"
    _no_split_modules = ["DiffLMDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flash_attn_2 = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, std)
        elif isinstance(module, DiffLMRMSNorm):
            module.weight.data.fill_(1.0)


class DiffLMModel(DiffLMPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DiffLMDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DiffLMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = DiffLMRotary(config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        b, n = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        key_mask = attention_mask.to(torch.long)
        if position_ids is None:
            position_ids = (key_mask.cumsum(-1) - 1).clamp(min=0) * key_mask
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary(h, position_ids)
        # Keys at padding are never attended; with a causal config also keys after the query.
        additive = torch.zeros(b, 1, n, n, dtype=h.dtype, device=h.device)
        blocked = (key_mask == 0)[:, None, None, :].expand(b, 1, n, n)
        if self.config.attn_mask_type == "causal":
            blocked = blocked | torch.ones(n, n, dtype=torch.bool, device=h.device).triu(1)
        additive = additive.masked_fill(blocked, torch.finfo(h.dtype).min)
        for layer in self.layers:
            h = layer(h, cos, sin, key_mask, additive)
        return self.norm(h)


class DiffLM(DiffLMPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = DiffLMModel(config)
        # Tied embeddings have no lm_head: the logits use the embedding matrix (dlm's export writes none).
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        h = self.model(input_ids, attention_mask, position_ids)
        w = self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight
        return CausalLMOutputWithPast(logits=F.linear(h, w).float())

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids, **kwargs}

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask=None, generation_config=None, max_new_tokens=None,
                 max_length=None, sample_steps=None, inference_block_size=None, remasking="low_confidence",
                 temperature=None, top_p=None, cfg=0.0, mask_token_id=None, seed=0, verbose=False, **kwargs):
        """MegaDLMs' arguments: input_ids [B, P] left-padded with attention_mask; max_new_tokens G (else
        max_length - P, else max_position_embeddings - P); sample_steps S (default G); inference_block_size
        K (default G); remasking low_confidence | random; temperature and top_p (else those of
        generation_config, as MegaDLMs reads them; T = 0 is greedy); cfg, the guidance scale w; seed, the
        Philox seed of dlm-generate --seed. Returns x [B, P + G]."""
        gc = generation_config if generation_config is not None else getattr(self, "generation_config", None)
        if temperature is None:
            temperature = getattr(gc, "temperature", None)
            temperature = 1.0 if temperature is None else temperature
        if top_p is None:
            top_p = getattr(gc, "top_p", None)
            top_p = 1.0 if top_p is None else top_p
        mask_id = self.config.mask_token_id if mask_token_id is None else mask_token_id
        if mask_id is None:
            raise ValueError("generate: the config has no mask_token_id (pass mask_token_id=)")
        prompt_len = input_ids.shape[1]
        if max_new_tokens is not None:
            gen = int(max_new_tokens)
        elif max_length is not None:
            gen = int(max_length) - prompt_len
        else:
            gen = self.config.max_position_embeddings - prompt_len
        steps = int(sample_steps) if sample_steps else gen
        block = int(inference_block_size) if inference_block_size else gen
        if gen <= 0 or gen % block:
            raise ValueError(f"generate: inference_block_size {block} must divide max_new_tokens {gen}")
        blocks = gen // block
        if steps <= 0 or steps % blocks:
            raise ValueError(f"generate: sample_steps {steps} must be a positive multiple of the {blocks} blocks")
        if remasking not in ("low_confidence", "random"):
            raise ValueError(f"generate: remasking '{remasking}' is not low_confidence or random")
        if temperature < 0 or not 0 < top_p <= 1 or cfg < 0:
            raise ValueError(f"generate: temperature {temperature}, top_p {top_p}, cfg {cfg} out of range")
        steps //= blocks

        device = self.model.embed_tokens.weight.device
        rows, length = input_ids.shape[0], prompt_len + gen
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        att = torch.ones(rows, length, dtype=torch.long, device=device)
        att[:, :prompt_len] = attention_mask.to(device=device, dtype=torch.long)
        position_ids = (att.cumsum(-1) - 1).clamp(min=0) * att
        x = torch.full((rows, length), mask_id, dtype=torch.long, device=device)
        x[:, :prompt_len] = input_ids.to(device)
        is_prompt = torch.zeros(rows, length, dtype=torch.bool, device=device)
        is_prompt[:, :prompt_len] = att[:, :prompt_len] == 1
        rng = _Philox(seed)
        w1 = torch.tensor(cfg, dtype=torch.float32) + 1  # w + 1 in fp32, as dlm's sampler computes it
        columns = torch.arange(length, device=device)
        serial = 0
        for b in range(blocks):
            begin, end = prompt_len + b * block, prompt_len + (b + 1) * block
            counts = [_transfer_counts(int(n), steps) for n in (x[:, begin:end] == mask_id).sum(-1).tolist()]
            for step in range(steps):
                if cfg > 0:
                    uncond = x.masked_fill(is_prompt, mask_id)
                    both = self(torch.cat([x, uncond]), torch.cat([att, att]), torch.cat([position_ids] * 2)).logits
                    c, u = both[:rows], both[rows:]
                    logits = u + w1 * (c - u)
                else:
                    logits = self(x, att, position_ids).logits
                candidate = (x == mask_id) & (att == 1) & (columns < end)[None, :]
                where = candidate.nonzero(as_tuple=False)
                draws = (serial * rows + where[:, 0]) * length + where[:, 1]
                picked = logits[where[:, 0], where[:, 1]]  # [n, vocab] fp32
                if temperature == 0:
                    x0 = picked.argmax(-1)
                else:
                    x0 = _gumbel_argmax(_top_p(picked.double(), top_p), temperature, rng, draws)
                if remasking == "low_confidence":
                    conf = F.softmax(picked.double(), dim=-1).gather(-1, x0[:, None])[:, 0]
                else:
                    conf = rng.uniform(_RANDOM_CONFIDENCE, draws, torch.zeros_like(draws))
                confidence = torch.full((rows, length), -math.inf, dtype=torch.float64, device=device)
                confidence[where[:, 0], where[:, 1]] = conf
                proposal = x.clone()
                proposal[where[:, 0], where[:, 1]] = x0
                for r in range(rows):
                    order = torch.sort(confidence[r], descending=True, stable=True).indices[: counts[r][step]]
                    order = order[confidence[r, order] != -math.inf]
                    x[r, order] = proposal[r, order]
                serial += 1
            if verbose:
                print(f"DiffLM.generate: block {b + 1}/{blocks} decoded")
        return x


def _transfer_counts(masked, steps):
    return [masked // steps + (1 if i < masked % steps else 0) for i in range(steps)]


def _top_p(logits, p):
    """dlm's nucleus filter: by probability (descending, lower id first on ties), drop every token whose
    preceding cumulative probability exceeds p."""
    if p >= 1.0:
        return logits
    probs = torch.exp(logits - logits.max(-1, keepdim=True).values)
    probs = probs / probs.sum(-1, keepdim=True)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    # The sum of the probabilities before each one, accumulated in order as dlm does (not cumsum - p).
    before = torch.cat([torch.zeros_like(sorted_probs[:, :1]), torch.cumsum(sorted_probs, dim=-1)[:, :-1]], dim=-1)
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before > p)
    return logits.masked_fill(drop, -math.inf)


_GUMBEL, _RANDOM_CONFIDENCE = 11, 12
_M32 = 0xFFFFFFFF


class _Philox:
    """dlm's CounterRng (include/dlm/train/philox.h): Philox4x32-10 on counter (index lo, index hi, sub,
    domain) with the seed as key; uniform() takes 53 bits as numpy does. Vectorized over int64 tensors
    (products wrap modulo 2^64, which keeps the bits that matter)."""

    def __init__(self, seed):
        self.key = (int(seed) & _M32, (int(seed) >> 32) & _M32)

    def bits(self, domain, index, sub):
        c0, c1 = index & _M32, (index >> 32) & _M32
        c2, c3 = sub & _M32, torch.full_like(sub, domain)
        k0, k1 = self.key
        for _ in range(10):
            p0, p1 = c0 * 0xD2511F53, c2 * 0xCD9E8D57
            c0, c1, c2, c3 = (((p1 >> 32) & _M32) ^ c1 ^ k0, p1 & _M32, ((p0 >> 32) & _M32) ^ c3 ^ k1, p0 & _M32)
            k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
        return c0, c1

    def uniform(self, domain, index, sub):
        b0, b1 = self.bits(domain, index, sub)
        return ((b0 >> 5).double() * 67108864.0 + (b1 >> 6).double()) / 9007199254740992.0


def _gumbel_argmax(logits, temperature, rng, draws, chunk=64):
    """argmax_v (logits_v - T log(-log U_v)), U in (0, 1] addressed by (draw, v); -inf stays -inf."""
    out = []
    vocab = torch.arange(logits.shape[-1], dtype=torch.int64, device=logits.device)
    for i in range(0, logits.shape[0], chunk):
        l, d = logits[i:i + chunk], draws[i:i + chunk]
        u = 1.0 - rng.uniform(_GUMBEL, d[:, None].expand(-1, vocab.numel()), vocab[None, :].expand(d.numel(), -1))
        noisy = torch.where(l == -math.inf, l, l - temperature * torch.log(-torch.log(u)))
        out.append(noisy.argmax(-1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64, device=logits.device)
