#pragma once
// A JSON file read a piece at a time (a few megabytes), for the fast reader of dump.json: a value's
// text is found by its brackets and handed out whole, and what was handed out is dropped at the
// next read. A million-entry dump.json is some 800 MB; held whole (with the index a parser of the
// whole text builds) both sides of a compare needed about 3 GB before a row was made.
//
// Only the file's outer layers are read here: the text of each value handed out is checked by the
// caller's parser (simdjson's DOM). Whatever is not plain JSON at these layers -- a missing bracket,
// a byte that is neither whitespace nor the token expected, a key with a control character or invalid
// UTF-8 -- throws NotPlain, and the caller reads the file another way.
#include <simdjson.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace torchprobe::compare::details {

// The text needs load_dump's reading (see dump_rows_reader.hpp).
struct NotPlain {};

// What a byte is to the walk of a value outside its strings.
enum class Byte : unsigned char { plain, quote, open, close };
struct ByteKinds {
  Byte kind[256] = {};
  constexpr ByteKinds() {
    kind[static_cast<unsigned char>('"')] = Byte::quote;
    kind[static_cast<unsigned char>('{')] = kind[static_cast<unsigned char>('[')] = Byte::open;
    kind[static_cast<unsigned char>('}')] = kind[static_cast<unsigned char>(']')] = Byte::close;
  }
};
inline constexpr ByteKinds kBytes{};

class JsonPieces {
 public:
  // `piece`: bytes read at a time (tests read in pieces of a few bytes, to cross every boundary).
  explicit JsonPieces(const std::filesystem::path& path, std::size_t piece = std::size_t(8) << 20)
      : in_(path, std::ios::binary), piece_(std::max<std::size_t>(piece, 1)) {
    if (!in_) throw NotPlain{};
    // No larger than the file: a piece's room is zero-filled when made, 8 MB for a 1 KB dump else.
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec) piece_ = std::min<std::size_t>(piece_, static_cast<std::size_t>(size) + 1);
  }

  // The next byte that is not JSON whitespace (consumed unless `keep`); -1 at the end of the file.
  int next_token(bool keep = false) {
    for (;;) {
      for (; at_ < end(); ++at_) {
        const char c = *ptr(at_);
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        if (!keep) ++at_;
        return static_cast<unsigned char>(c);
      }
      if (!more()) return -1;
    }
  }
  void expect(char c) {
    if (next_token() != static_cast<unsigned char>(c)) throw NotPlain{};
  }

  // A string's text, its opening quote consumed already; a key with an escape is unescaped by
  // simdjson. Valid until the next call.
  std::string_view string() {
    const std::size_t from = at_;
    bool escaped = false, any_escape = false;
    for (;;) {
      for (; at_ < end(); ++at_) {
        const char c = *ptr(at_);
        if (static_cast<unsigned char>(c) < 0x20) throw NotPlain{};  // a control character: invalid JSON
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = any_escape = true;
        } else if (c == '"') {
          const std::string_view raw(ptr(from), at_ - from);
          ++at_;
          if (!simdjson::validate_utf8(raw.data(), raw.size())) throw NotPlain{};
          return any_escape ? unescape(raw) : raw;
        }
      }
      if (!more()) throw NotPlain{};
    }
  }

  // The text of the value that starts here (after whitespace): an object or array up to its closing
  // bracket, a string, or a scalar up to the next delimiter. Followed in memory by
  // simdjson::SIMDJSON_PADDING readable bytes, as simdjson's parsers need; valid until the next call.
  std::string_view value() {
    const int first = next_token(true);
    if (first < 0) throw NotPlain{};
    const std::size_t from = at_;
    if (first == '{' || first == '[') {
      // The walk that finds a value's end reads every byte of the file: a table says which bytes
      // matter outside strings, and a string is skipped to its next quote or backslash in a tight
      // loop (the state tested per byte cost a seventh of the reading).
      int depth = 0;
      bool in_string = false, escaped = false;
      for (;;) {
        const char* p = ptr(at_);
        const char* const stop = ptr(end());
        while (p < stop) {
          if (in_string) {
            if (escaped) {
              escaped = false;
              ++p;
              continue;
            }
            while (p < stop && *p != '"' && *p != '\\') ++p;
            if (p == stop) break;
            if (*p == '\\')
              escaped = true;
            else
              in_string = false;
            ++p;
            continue;
          }
          const Byte kind = kBytes.kind[static_cast<unsigned char>(*p++)];
          if (kind == Byte::plain) continue;
          if (kind == Byte::quote) {
            in_string = true;
          } else if (kind == Byte::open) {
            ++depth;
          } else if (--depth == 0) {
            at_ += static_cast<std::size_t>(p - ptr(at_));
            return {ptr(from), at_ - from};
          }
        }
        at_ = end();
        if (!more()) throw NotPlain{};
      }
    }
    if (first == '"') {
      ++at_;
      static_cast<void>(string());
      return {ptr(from), at_ - from};
    }
    for (;;) {  // a number, true, false, null (or anything else, which the caller's parser rejects)
      for (; at_ < end(); ++at_) {
        const char c = *ptr(at_);
        if (c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\r' || c == '\t')
          return {ptr(from), at_ - from};
      }
      if (!more()) return {ptr(from), at_ - from};
    }
  }

  // Everything before the current place may be dropped at the next read.
  void release() { kept_from_ = at_; }

 private:
  const char* ptr(std::size_t offset) const { return buf_.data() + (offset - base_); }
  std::size_t end() const { return base_ + valid_; }

  // Reads the next piece after what is held, first dropping what was released. False at the end.
  bool more() {
    if (done_) return false;
    const std::size_t drop = kept_from_ - base_;
    if (drop > 0) {
      std::memmove(buf_.data(), buf_.data() + drop, valid_ - drop);
      valid_ -= drop;
      base_ = kept_from_;
    }
    const std::size_t want = std::max(piece_, valid_);  // a value longer than a piece: the room doubles
    if (buf_.size() < valid_ + want + simdjson::SIMDJSON_PADDING)
      buf_.resize(valid_ + want + simdjson::SIMDJSON_PADDING);
    in_.read(buf_.data() + valid_, static_cast<std::streamsize>(want));
    const auto got = static_cast<std::size_t>(in_.gcount());
    valid_ += got;
    std::memset(buf_.data() + valid_, ' ', simdjson::SIMDJSON_PADDING);
    if (got < want) done_ = true;
    return got > 0;
  }

  std::string_view unescape(std::string_view raw) {
    quoted_.assign(1, '"').append(raw).append(1, '"');
    simdjson::dom::element e;
    if (key_parser_.parse(quoted_).get(e) != simdjson::SUCCESS || !e.is_string()) throw NotPlain{};
    unescaped_ = std::string(std::string_view(e));
    return unescaped_;
  }

  std::ifstream in_;
  std::size_t piece_;
  std::string buf_;        // file bytes [base_, base_ + valid_), then padding
  std::size_t base_ = 0;   // file offset of buf_[0]
  std::size_t valid_ = 0;  // bytes of the file held
  std::size_t at_ = 0;     // file offset of the next byte to read
  std::size_t kept_from_ = 0;
  bool done_ = false;
  std::string quoted_, unescaped_;
  simdjson::dom::parser key_parser_;
};

}  // namespace torchprobe::compare::details
