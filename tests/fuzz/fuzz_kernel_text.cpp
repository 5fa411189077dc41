// libFuzzer target over everything that turns a caller's text into code or reads it back from
// the kernel cache: kernel declarations and names, raw kernels' entries, where the body lands in
// the generated source, cache entries and keys, compiler logs, and scalar arguments. Built and
// run by scripts/fuzz (clang, -fsanitize=fuzzer,address,undefined).
//
// Input: one selector byte, then fields separated by 0x1f. A refusal must be a
// std::invalid_argument (or, for scalars, argument_range_error); any other exception, a crash
// or a sanitizer report is a finding. Accepted input must keep the generated source's shape.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/kernels/kernel_cache.hpp"
#include "core/kernels/kernel_source.hpp"
#include "core/kernels/user_call.hpp"
#include "cpu/host_source.hpp"
#include "cuda/cuda_source.hpp"
#include "gpupool/elementwise.hpp"

namespace {

using namespace gpupool;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_kernel_text: %s\n", what);
  __builtin_trap();
}

std::vector<std::string> fields_of(std::string_view text, std::size_t at_most) {
  std::vector<std::string> out;
  while (out.size() + 1 < at_most) {
    const std::size_t end = text.find('\x1f');
    if (end == std::string_view::npos) break;
    out.emplace_back(text.substr(0, end));
    text.remove_prefix(end + 1);
  }
  out.emplace_back(text);
  while (out.size() < at_most) out.emplace_back();
  return out;
}

bool identifier(const std::string& s) {
  if (s.empty() || s.size() > detail::max_name_length) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool printable(std::string_view s) {
  for (unsigned char c : s)
    if (c < 0x20 || c >= 0x7f) return false;
  return true;
}

// The generated source's line `line` (1-based) starts at the returned offset.
std::size_t offset_of_line(const std::string& source, int line) {
  std::size_t at = 0;
  for (int i = 1; i < line; ++i) {
    at = source.find('\n', at);
    if (at == std::string::npos) finding("the source has fewer lines than the body's line");
    ++at;
  }
  return at;
}

void check_generated(const elementwise_kernel& k, const std::vector<bool>& is_array) {
  if (!identifier(k.name())) finding("an accepted kernel name is not an identifier");
  for (const auto& p : k.inputs())
    if (!identifier(p.name) || p.name.rfind("gpupool_", 0) == 0)
      finding("an accepted parameter name is not a usable identifier");
  const std::string host = detail::host_source(k, is_array);
  // Everything before the body is gpupool's text and the validated names: one comment line, no
  // second line made by a name.
  const std::size_t host_body = offset_of_line(host, detail::host_body_first_line(k));
  if (host.compare(host_body, k.body().size(), k.body()) != 0)
    finding("the body is not where host_body_first_line says");
  if (!printable(host.substr(0, host.find('\n'))))
    finding("the generated first line holds unprintable bytes");
  const std::string cuda = detail::cuda_source(k, is_array);
  const std::size_t cuda_body = offset_of_line(cuda, detail::cuda_body_first_line(k));
  if (cuda.compare(cuda_body, k.body().size(), k.body()) != 0)
    finding("the body is not where cuda_body_first_line says");
}

template <class F>
void refusal_is_clear(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    if (!printable(e.what())) finding("a refusal's message holds unprintable bytes");
    if (std::strncmp(e.what(), "gpupool", 7) != 0) finding("a refusal does not say gpupool");
  }
}

void elementwise(const std::vector<std::string>& f, std::uint8_t pattern) {
  refusal_is_clear([&] {
    elementwise_kernel k(f[0], f[1], f[2], f[3]);
    std::vector<bool> is_array;
    for (std::size_t i = 0; i < k.inputs().size(); ++i)
      is_array.push_back((pattern >> (i % 8)) & 1);
    check_generated(k, is_array);
  });
}

void raw(const std::vector<std::string>& f) {
  refusal_is_clear([&] {
    raw_kernel k(f[2], f[3], f[0], f[1]);
    const std::string& entry = k.entry();
    for (std::size_t start = 0;;) {
      const std::size_t end = entry.find("::", start);
      if (!identifier(entry.substr(start, end == std::string::npos ? end : end - start)))
        finding("an accepted entry is not identifiers joined by ::");
      if (end == std::string::npos) break;
      start = end + 2;
    }
  });
}

void cache_entries(const std::vector<std::string>& f) {
  // Arbitrary bytes read back as an entry for an arbitrary key: a miss or the exact image.
  (void)detail::parse_entry(f[0], f[1]);
  if (!f[2].empty()) {
    const std::string entry = detail::make_entry(f[1], f[2]);
    const auto back = detail::parse_entry(entry, f[1]);
    if (!back || *back != f[2]) finding("an entry does not read back");
    if (detail::parse_entry(entry, f[1] + "x")) finding("an entry answered for another key");
    if (detail::parse_entry(entry.substr(0, entry.size() - 1), f[1]))
      finding("a truncated entry was accepted");
  }
  if (detail::entry_file_name(f[1], ".e").find('/') != std::string::npos)
    finding("an entry's file name leaves its folder");
  const int line = detail::body_line_of_first_error(f[0], f[1], static_cast<int>(f[2].size() % 50));
  if (line < 0) finding("a negative body line");
}

void scalars(const std::vector<std::string>& f, std::string_view values) {
  refusal_is_clear([&] {
    elementwise_kernel k(f[0], f[1], "y = 0;", "fuzz");
    std::vector<kernel_argument> args;
    for (std::size_t i = 0; i < k.inputs().size(); ++i) {
      std::uint64_t bits = 0;
      const std::string_view chunk = values.substr(std::min(values.size(), i * 9), 9);
      std::memcpy(&bits, chunk.data() + (chunk.empty() ? 0 : 1),
                  chunk.size() > 1 ? std::min<std::size_t>(8, chunk.size() - 1) : 0);
      const bool integer = !chunk.empty() && (chunk[0] & 1);
      double d = 0;
      std::memcpy(&d, &bits, sizeof d);
      if (integer)
        args.emplace_back(static_cast<long long>(bits));
      else
        args.emplace_back(d);
    }
    try {
      (void)detail::prepare_call(k, args, k.output().type, 1);
    } catch (const std::overflow_error& e) {
      if (!printable(e.what())) finding("an overflow message holds unprintable bytes");
    }
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const auto f = fields_of(text, 4);
  switch (data[0] % 4) {
    case 0:
      elementwise(f, data[1]);
      break;
    case 1:
      raw(f);
      break;
    case 2:
      cache_entries(f);
      break;
    default:
      scalars(f, f[2]);
      break;
  }
  return 0;
}
