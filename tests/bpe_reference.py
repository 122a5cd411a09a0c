"""Hugging Face tokenizers' byte-level BPE, the reference of troupe's GPT-2 tokenizer
(tests/data_bpe_test.cc): trains one on the corpus files (GPT-2's pre-tokenizer: ByteLevel
without a prefix space; "<|endoftext|>" as its special token), saves it in GPT-2's format
(OUT/vocab.json, OUT/merges.txt), then prints, as one JSON list, the ids it gives each text of
the JSON list in TEXTS and those of each file in ENCODE (read as UTF-8), as ordinary text.

Run with .venv-tokenizers/bin/python (scripts/setup.sh makes it):
    python tests/bpe_reference.py --corpus A.txt B.txt --vocab-size 2000 --out DIR \\
        --texts texts.json --encode C.txt
"""
import argparse
import json

from tokenizers import Tokenizer, models, pre_tokenizers, trainers


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--texts", required=True)
    p.add_argument("--encode", nargs="*", default=[])
    a = p.parse_args()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=a.vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train(a.corpus, trainer)
    tokenizer.model.save(a.out)
    # Text is text: "<|endoftext|>" in it is not the special token (tiktoken's encode_ordinary,
    # which llm.c's data scripts use; GPT-2's encoder.py).
    tokenizer.encode_special_tokens = True
    with open(a.texts, encoding="utf-8") as f:
        texts = json.load(f)
    for path in a.encode:
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    print(json.dumps([tokenizer.encode(t).ids for t in texts]))


if __name__ == "__main__":
    main()
