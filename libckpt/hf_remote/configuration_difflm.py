# Configuration of dlm's masked-diffusion language model, written by `dlm-ckpt convert --to hf` beside
# the weights and loaded through config.json's auto_map with trust_remote_code=True.
#
# The fields are those of the plain Qwen3/Llama config.json the same export writes (model_type stays
# "qwen3" or "llama", so that loading without remote code gives the plain causal model), plus
# mask_token_id and attn_mask_type (MegaDLMs' DiffLM fields). q/k norms are on unless model_type is
# "llama" (dlm exports models without them as Llama).
from transformers import PretrainedConfig


class DiffLMConfig(PretrainedConfig):
    model_type = "difflm"

    def __init__(self, vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                 num_attention_heads=16, num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
                 rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.02,
                 mask_token_id=None, attn_mask_type="bidirectional", qk_layernorm=None, hidden_act="silu",
                 **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        # transformers 5 writes the RoPE base as rope_parameters.rope_theta.
        rope = kwargs.get("rope_parameters")
        self.rope_theta = float(rope["rope_theta"]) if isinstance(rope, dict) and "rope_theta" in rope else float(rope_theta)
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        if attn_mask_type not in ("bidirectional", "no_mask", "causal"):
            raise ValueError(f"attn_mask_type: '{attn_mask_type}' (expected bidirectional or causal)")
        self.attn_mask_type = attn_mask_type
        self.qk_layernorm = kwargs.get("model_type", "qwen3") != "llama" if qk_layernorm is None else bool(qk_layernorm)
        if hidden_act not in ("silu", "swish"):
            raise ValueError(f"hidden_act: '{hidden_act}' (dlm's MLP is SwiGLU: silu)")
        self.hidden_act = hidden_act
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
