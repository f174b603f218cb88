"""Writes a tiny Llama checkpoint with real random weights into a local directory (no hub).

float32, 2 KV heads of head_dim 64 (the CPU attention backend supports 64), seeded: the same
seed gives byte-identical weights, another seed another model of the same architecture.
`--arch deepseek_v2` writes a tiny DeepSeek-V2 instead (MLA attention).

    python tiny_model.py OUT_DIR [--seed N] [--layers N] [--hidden N] [--arch deepseek_v2]
"""

import argparse
import json
import os


def _written(out_dir, params):
    """True when out_dir already holds a checkpoint written with these parameters."""
    stamp = os.path.join(out_dir, "mcstore-tiny.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            return json.load(f) == params
    return False


def _save(model_cls, cfg, seed, out_dir, params):
    """Random weights (seeded, larger than the default init so that attention is not uniform and
    outputs depend on the KV), saved as safetensors with the parameters' stamp."""
    import torch
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "mcstore-tiny.json"), "w") as f:
        json.dump(params, f)
    return out_dir


def write_tiny_llama(out_dir, seed=0, layers=2, hidden=256, heads=None, kv_heads=2, vocab=2048,
                     max_positions=4096):
    """Writes config.json + model.safetensors into out_dir (skipped when already there with the
    same parameters). Returns out_dir."""
    heads = heads or hidden // 64
    params = dict(seed=seed, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                  vocab=vocab, max_positions=max_positions)
    if _written(out_dir, params):
        return out_dir
    from transformers import LlamaConfig, LlamaForCausalLM

    head_dim = hidden // heads
    assert head_dim == 64, "the CPU attention backend wants head_dim 64 here"
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=max_positions, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, torch_dtype="float32",
                      bos_token_id=1, eos_token_id=2)
    return _save(LlamaForCausalLM, cfg, seed, out_dir, params)


def write_tiny_deepseek(out_dir, seed=0, layers=2, hidden=256, vocab=2048, max_positions=4096):
    """A tiny DeepSeek-V2 (MLA: one latent KV of kv_lora_rank 512 + rope 64 per token, the only
    size vLLM's CPU MLA kernel compiles for; MoE with 2 routed experts, both layers dense)."""
    params = dict(arch="deepseek_v2", seed=seed, layers=layers, hidden=hidden, vocab=vocab,
                  max_positions=max_positions)
    if _written(out_dir, params):
        return out_dir
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    cfg = DeepseekV2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                           moe_intermediate_size=hidden // 2, num_hidden_layers=layers,
                           num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1,
                           n_routed_experts=2, num_experts_per_tok=1,
                           first_k_dense_replace=layers, kv_lora_rank=512, q_lora_rank=None,
                           qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
                           max_position_embeddings=max_positions, rms_norm_eps=1e-5,
                           tie_word_embeddings=False, torch_dtype="float32", bos_token_id=1,
                           eos_token_id=2, rope_scaling=None)
    return _save(DeepseekV2ForCausalLM, cfg, seed, out_dir, params)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--arch", choices=("llama", "deepseek_v2"), default="llama",
                    help="deepseek_v2: an MLA model")
    a = ap.parse_args()
    write = write_tiny_deepseek if a.arch == "deepseek_v2" else write_tiny_llama
    print(write(a.out_dir, seed=a.seed, layers=a.layers, hidden=a.hidden))
