#!/usr/bin/env bash
# Rewrites tests/fuzz/corpus/ from troupe's own writers (make_seeds.cc, on Debian's Fashion-MNIST)
# and the repository's configs/*.toml. Builds into build/ as scripts/build.sh does.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/build.sh troupe_fuzz_seeds
build_dir=${BUILD_DIR:-build}
corpus=tests/fuzz/corpus
rm -rf "$corpus"
"$build_dir/tests/troupe_fuzz_seeds" /usr/share/datasets/fashion-mnist "$corpus"
mkdir -p "$corpus/config"
cp configs/*.toml "$corpus/config/"
# Configs with overrides: the file's text, a NUL, then flags (key=value) and troupe launch's
# variables ($TROUPE_X=value), one a line (config_fuzz.cc).
printf 'model = "mlp"\nbatch_size = 32\nlr_milestones = [1, 2]\n\0momentum=0.9\nweight_decay=0.0005\nwork_load_list=1,2\n' \
  >"$corpus/config/overrides_file_and_flags"
printf '\0step_timeout=30\nseed=18446744073709551615\nthreads=4\nlr_policy=multistep\n$TROUPE_GENERATION=1\n' \
  >"$corpus/config/overrides_flags_only"
printf '\0$TROUPE_NUM_WORKERS=2\n$TROUPE_RANK=1\n$TROUPE_RENDEZVOUS=tcp://127.0.0.1:1\n$TROUPE_RUN_ID=r1\n' \
  >"$corpus/config/overrides_launch_variables"
printf 'momentum = 0.99999994\nscale = 1e6\npeer_timeout = 2592000\n\0epoch_size=1099511627776\nbatch_size=1048576\n' \
  >"$corpus/config/overrides_range_ends"
# GPT-2's BPE (bpe_fuzz.cc): a vocabulary of every byte in GPT-2's byte-to-character mapping and
# a few merges (the space as U+0120), a NUL, the merges, a NUL, then text.
python3 - "$corpus/bpe" <<'PY'
import json, os, sys
printable = [b for b in range(256) if 33 <= b <= 126 or 0xA1 <= b <= 0xAC or b >= 0xAE]
chars, extra = {}, 0
for b in range(256):
    if b in printable:
        chars[b] = chr(b)
    else:
        chars[b] = chr(256 + extra)
        extra += 1
vocab = {chars[b]: b for b in range(256)}
space = chars[32]
merges = [("t", "h"), (space, "th"), ("e", "r"), (space + "th", "e"), ("i", "n")]
for a, b in merges:
    vocab[a + b] = len(vocab)
vocab["<|endoftext|>"] = len(vocab)
os.makedirs(sys.argv[1], exist_ok=True)
text = "The weather in the north, there: 3 other things \u00e9t\u00e9 \u6771\u4eac!\n\n  end "
for name, body in (("gpt2_style", json.dumps(vocab, ensure_ascii=True)),
                   ("raw_utf8", json.dumps(vocab, ensure_ascii=False))):
    seed = body + "\0#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges) + "\0" + text
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(seed.encode("utf-8"))
PY
du -sh "$corpus"/*
