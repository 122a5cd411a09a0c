// libFuzzer target: GPT-2's BPE files and text (data/bpe.h). The input is a vocabulary, a NUL, its
// merges, a NUL, then text. Loading may only throw troupe::Error (the files are refused, naming
// them); a tokenizer that loaded encodes any text, and its tokens decode to that text's bytes.
// Anything else (a crash, another exception, a sanitizer report, a round trip that differs) is a
// finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "data/bpe.h"
#include "fuzz_util.h"
#include "troupe/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static troupe::fuzz::ScratchFile vocab(".json"), merges(".txt");
  std::string_view input(reinterpret_cast<const char*>(data), size);
  auto part = [&input] {
    const auto nul = input.find('\0');
    const std::string_view head = input.substr(0, nul);
    input = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
    return head;
  };
  const std::string_view vocab_text = part(), merges_text = part(), text = input;
  auto bytes = [](std::string_view s) { return reinterpret_cast<const std::uint8_t*>(s.data()); };
  std::optional<troupe::data::Gpt2Tokenizer> tokenizer;
  try {
    tokenizer =
        troupe::data::Gpt2Tokenizer::load(vocab.write(bytes(vocab_text), vocab_text.size()),
                                          merges.write(bytes(merges_text), merges_text.size()));
  } catch (const troupe::Error&) {
    return 0;
  }
  if (tokenizer->decode(tokenizer->encode(text)) != text) std::abort();
  return 0;
}
