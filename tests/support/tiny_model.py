"""A tiny random-weight Llama and its tokenizer, made locally (no download): run inside the vLLM
test image, which has torch, transformers and tokenizers.

    python3 tiny_model.py OUT_DIR

Head dim 64 (hidden 128, 2 heads): vLLM's CPU attention kernels refuse smaller ones. Two heads and
two KV heads split evenly over tensor-parallel 2. Seeded: the same files every time.
"""

import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SENTENCES = [
    "Hello, how are you today?",
    "The cluster serves one model across two nodes.",
    "Each node runs its own engine and joins over the private link.",
    "A healthy server answers a completion, not only a health check.",
    "Tensor parallel splits every layer; pipeline parallel splits the stack.",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def main(out: str) -> None:
    torch.manual_seed(0)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(SENTENCES, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])
