// Streaming detokenizer for generation loops: turns token ids into text piece by piece and never
// emits a broken UTF-8 sequence. A character split across tokens is held back until it is
// complete; bytes that can never form a valid character come out as U+FFFD.
//
//   StreamDetokenizer sd(vocab, /*render_special=*/false);
//   for (int32_t id : ids) std::cout << sd.push(id);
//   std::cout << sd.flush();   // whatever is still held (an unfinished character -> U+FFFD)
#pragma once
#include <cstdint>
#include <string>

namespace moe {

class Vocab;

class StreamDetokenizer {
public:
  explicit StreamDetokenizer(const Vocab &vocab, bool render_special);
  std::string push(int32_t id);  // throws InvalidArgument for an id outside the vocabulary
  std::string flush();
  void reset() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

private:
  const Vocab &vocab_;
  bool render_special_;
  std::string pending_;  // bytes of an unfinished character
};

}  // namespace moe
