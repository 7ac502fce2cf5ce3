"""Build a tiny random Llama model and BPE tokenizer for a real vLLM server (no downloads).

Run with the vLLM venv's Python (it has transformers and tokenizers)::

    .venv-vllm/bin/python tests/agent/make_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import sys

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "inference fleets serve many requests per second on many gpus",
    "a key value cache holds attention state for every running sequence",
    "queue time prefill time and decode time add up to the request latency",
    "power and energy of each gpu are sampled by the host agent",
    "hello world this is a tiny random model for end to end tests",
    "numbers one two three four five six seven eight nine ten",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def main(out: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])
