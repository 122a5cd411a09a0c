// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py; Hugging Face's ByteLevel BPE with
// add_prefix_space off), for `troupe convert text --vocab V --merges M`: GPT-2's own files
// (encoder.json and vocab.bpe) or any byte-level BPE saved in their format (vocab.json and
// merges.txt) give the ids those tools give.
//
// Text is split by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (gpt2Pieces: letters and numbers by Unicode's general categories, data/unicode_classes.inc;
// whitespace by Unicode's White_Space property), each piece's UTF-8 bytes are merged pairwise by
// the merges' ranks, lowest first, and each resulting token is looked up in the vocabulary.
// Bytes that are not UTF-8 count as neither letters, numbers nor whitespace. Text is ordinary
// text ("<|endoftext|>" in it is its characters, as tiktoken's encode_ordinary, which llm.c's data
// scripts use): the special token goes only where the caller puts it (endOfText()).
// Thread safety: encode() caches words; one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe::data {

// The pieces GPT-2's pattern splits `text` into, in order (views into it; they concatenate to it).
std::vector<std::string_view> gpt2Pieces(std::string_view text);

class Gpt2Tokenizer {
 public:
  // The vocabulary (a JSON object of token -> id, tokens in GPT-2's byte-to-character mapping)
  // and the merges (an optional "#version" line, then one pair "a b" a line, highest priority
  // first). InputError naming the file (and its line or byte) for a missing or malformed file, a
  // token outside the byte-to-character mapping, a merge whose parts or result the vocabulary
  // lacks, or a vocabulary without every single byte.
  static Gpt2Tokenizer load(const std::string& vocab_path, const std::string& merges_path);

  std::vector<std::uint32_t> encode(std::string_view text);
  // The bytes `ids` stand for (decode(encode(text)) == text); InputError naming an id the
  // vocabulary lacks.
  std::string decode(std::span<const std::uint32_t> ids) const;
  // The id of "<|endoftext|>", which llm.c's data scripts put before each document, if the
  // vocabulary has it.
  std::optional<std::uint32_t> endOfText() const { return end_of_text_; }
  // The largest id + 1: the vocab_size a model of these tokens needs.
  std::int64_t vocabSize() const { return vocab_size_; }

 private:
  void encodeWord(std::string_view word, std::vector<std::uint32_t>& out);

  std::unordered_map<std::string, std::uint32_t> ids_;    // a token's bytes -> its id
  std::unordered_map<std::uint32_t, std::string> bytes_;  // and back
  std::unordered_map<std::string, int> ranks_;            // pairKey(a, b) -> the merge's rank
  // Word -> its ids; emptied when it holds kCachedWords (gcide's 40 MB of English: about 330k).
  static constexpr std::size_t kCachedWords = 1 << 20;
  std::unordered_map<std::string, std::vector<std::uint32_t>> cache_;
  std::optional<std::uint32_t> end_of_text_;
  std::int64_t vocab_size_ = 0;
};

}  // namespace troupe::data
