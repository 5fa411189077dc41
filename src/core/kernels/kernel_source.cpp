#include "core/kernels/kernel_source.hpp"

#include <cstdio>
#include <iterator>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace gpupool {
namespace {

// Far above any real kernel, low enough that generated source stays small.
constexpr std::size_t max_parameters = 256;

// A name or declaration as messages quote it: printable ASCII kept, everything else (newlines,
// control bytes, non-ASCII) escaped, long text cut, so a message cannot carry a forged line.
std::string quoted(std::string_view text) {
  constexpr std::size_t shown = 80;
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > shown) out += "...";
  return out + "'";
}

// The dtypes' names, in a message: "float32, float64, int32 or int64".
std::string dtype_names() {
  std::string out;
  for (std::size_t i = 0; i < std::size(dtypes); ++i)
    out += (i == 0 ? "" : i + 1 == std::size(dtypes) ? " or " : ", ") + std::string(dtypes[i].name);
  return out;
}

dtype parse_type(const std::string& name, const std::string& where) {
  for (const dtype_info& t : dtypes)
    if (name == t.name || (*t.alias != '\0' && name == t.alias)) return t.type;
  throw std::invalid_argument("gpupool: unknown type " + quoted(name) + " in " + where + " (use " +
                              dtype_names() + ")");
}

bool is_cpp_keyword(std::string_view s) {
  static const std::set<std::string_view> keywords{
      "alignas",       "alignof",     "and",
      "and_eq",        "asm",         "auto",
      "bitand",        "bitor",       "bool",
      "break",         "case",        "catch",
      "char",          "char8_t",     "char16_t",
      "char32_t",      "class",       "compl",
      "concept",       "const",       "consteval",
      "constexpr",     "constinit",   "const_cast",
      "continue",      "co_await",    "co_return",
      "co_yield",      "decltype",    "default",
      "delete",        "do",          "double",
      "dynamic_cast",  "else",        "enum",
      "explicit",      "export",      "extern",
      "false",         "float",       "for",
      "friend",        "goto",        "if",
      "inline",        "int",         "long",
      "mutable",       "namespace",   "new",
      "noexcept",      "not",         "not_eq",
      "nullptr",       "operator",    "or",
      "or_eq",         "private",     "protected",
      "public",        "register",    "reinterpret_cast",
      "requires",      "return",      "short",
      "signed",        "sizeof",      "static",
      "static_assert", "static_cast", "struct",
      "switch",        "template",    "this",
      "thread_local",  "throw",       "true",
      "try",           "typedef",     "typeid",
      "typename",      "union",       "unsigned",
      "using",         "virtual",     "void",
      "volatile",      "wchar_t",     "while",
      "xor",           "xor_eq"};
  return keywords.count(s) != 0;
}

// [A-Za-z_][A-Za-z0-9_]*, at most max_name_length characters: nothing that could end a comment,
// a string or a declaration in the generated source.
// (ASCII by hand: <cctype> follows the process's locale, which Python sets from the user's.)
bool is_plain_identifier(std::string_view s) {
  const auto letter = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (s.empty() || s.size() > detail::max_name_length || !letter(s[0])) return false;
  for (char c : s)
    if (!letter(c) && !digit(c)) return false;
  return true;
}

bool is_identifier(const std::string& s) {
  return is_plain_identifier(s) && !is_cpp_keyword(s) &&
         s.rfind("gpupool_", 0) != 0;  // reserved for the generated code
}

// "type name" pairs; with `allow_arrays`, "type* name" declares an array.
std::vector<kernel_parameter> parse_parameters(const std::string& text, const std::string& where,
                                               bool allow_arrays) {
  if (text.size() > detail::max_declaration_length)
    throw std::invalid_argument("gpupool: " + where + " declaration is " +
                                std::to_string(text.size()) + " characters long (at most " +
                                std::to_string(detail::max_declaration_length) + ")");
  std::vector<kernel_parameter> out;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    std::string spaced;
    for (char c : item) spaced += c == '*' ? std::string(" * ") : std::string(1, c);
    std::stringstream words(spaced);
    std::string type, name, extra;
    words >> type >> name;
    const bool array = name == "*";
    if (array) words >> name;
    if (type.empty() && name.empty()) continue;
    if (array && !allow_arrays)
      throw std::invalid_argument("gpupool: " + quoted(item) + " in " + where +
                                  ": elementwise parameters are plain 'type name' pairs; "
                                  "arrays and scalars are told apart at each call");
    if (name.empty() || name == "*" || (words >> extra))
      throw std::invalid_argument("gpupool: " + quoted(item) + " in " + where + " is not a 'type " +
                                  (allow_arrays ? "[*] " : "") + "name' pair");
    if (!is_identifier(name))
      throw std::invalid_argument("gpupool: " + quoted(name) + " in " + where +
                                  " is not a usable parameter name (a C++ identifier of at most " +
                                  std::to_string(detail::max_name_length) +
                                  " characters, not a keyword, not starting with 'gpupool_')");
    out.push_back({name, parse_type(type, where), array});
    if (out.size() > max_parameters)
      throw std::invalid_argument("gpupool: " + where + " declare more than " +
                                  std::to_string(max_parameters) + " parameters");
  }
  return out;
}

void require_unique_names(const std::vector<kernel_parameter>& inputs,
                          const kernel_parameter& output) {
  std::set<std::string> names{output.name};
  for (const auto& p : inputs)
    if (!names.insert(p.name).second)
      throw std::invalid_argument("gpupool: parameter '" + p.name + "' is declared twice");
}

kernel_parameter single_output(const std::string& text, bool allow_arrays) {
  const auto outputs = parse_parameters(text, "the output", allow_arrays);
  if (outputs.size() != 1) throw std::invalid_argument("gpupool: a kernel has exactly one output");
  return outputs[0];
}

bool blank(const std::string& text) {
  return text.find_first_not_of(" \t\r\n") == std::string::npos;
}

// A kernel's name appears in the generated source's first comment, in NVRTC's file name and in
// messages: a plain identifier, so it cannot end the comment and add code.
void require_kernel_name(const std::string& name) {
  if (!is_plain_identifier(name))
    throw std::invalid_argument("gpupool: kernel name " + quoted(name) +
                                " is not a C++ identifier of at most " +
                                std::to_string(detail::max_name_length) + " characters");
}

// A raw kernel's entry: an identifier, or identifiers joined by "::" (a name in a namespace),
// which NVRTC looks up as a name expression.
void require_entry_name(const std::string& entry) {
  bool ok = !entry.empty() && entry.size() <= detail::max_name_length;
  for (std::size_t start = 0; ok;) {
    const std::size_t end = entry.find("::", start);
    const std::string_view part = std::string_view(entry).substr(
        start, end == std::string::npos ? std::string::npos : end - start);
    ok = is_plain_identifier(part) && !is_cpp_keyword(part);
    if (end == std::string::npos) break;
    start = end + 2;
  }
  if (!ok)
    throw std::invalid_argument("gpupool: raw kernel entry " + quoted(entry) +
                                " is not a C++ name (identifiers, optionally joined by '::', at "
                                "most " +
                                std::to_string(detail::max_name_length) + " characters)");
}

}  // namespace

elementwise_kernel::elementwise_kernel(const std::string& inputs, const std::string& output,
                                       std::string body, std::string name)
    : inputs_(parse_parameters(inputs, "the inputs", false)),
      output_(single_output(output, false)),
      body_(std::move(body)),
      name_(std::move(name)) {
  require_kernel_name(name_);
  require_unique_names(inputs_, output_);
  if (blank(body_)) throw std::invalid_argument("gpupool: the kernel's body is empty");
}

raw_kernel::raw_kernel(std::string source, std::string entry, const std::string& inputs,
                       const std::string& output, launch_shape shape)
    : source_(std::move(source)),
      entry_(std::move(entry)),
      inputs_(parse_parameters(inputs, "the inputs", true)),
      output_(single_output(output, true)),
      shape_(shape) {
  output_.array = true;
  require_unique_names(inputs_, output_);
  if (blank(source_)) throw std::invalid_argument("gpupool: the raw kernel's source is empty");
  if (blank(entry_)) throw std::invalid_argument("gpupool: name the raw kernel's entry point");
  require_entry_name(entry_);
  if (shape_.block == 0 || shape_.block > 1024)
    throw std::invalid_argument("gpupool: a raw kernel's block holds 1 to 1024 threads, not " +
                                std::to_string(shape_.block));
}

namespace detail {

void write_element_body(std::ostream& s, const elementwise_kernel& k, const char* out_t) {
  s << "    " << out_t << ' ' << k.output().name << "{};\n"
    << "    {\n"
    << k.body() << "\n;\n"
    << "    }\n"
    << "    gpupool_out[gpupool_i] = " << k.output().name << ";\n"
    << "  }\n"
    << "}\n";
}

int body_line_of_first_error(std::string_view log, std::string_view prefix, int body_first_line) {
  std::size_t start = 0;
  while (start < log.size()) {
    std::size_t end = log.find('\n', start);
    if (end == std::string_view::npos) end = log.size();
    const std::string_view line = log.substr(start, end - start);
    start = end + 1;
    const std::size_t at = line.find(prefix);
    if (at == std::string_view::npos || line.find("error") == std::string_view::npos) continue;
    // The log quotes the user's text, so a "line number" may be any run of digits: one past
    // any real source's length is not a line.
    constexpr int beyond_any_line = 100'000'000;
    int number = 0;
    bool digits = false;
    for (std::size_t i = at + prefix.size();
         i < line.size() && line[i] >= '0' && line[i] <= '9' && number < beyond_any_line; ++i) {
      number = number * 10 + (line[i] - '0');
      digits = true;
    }
    if (!digits || number >= beyond_any_line) continue;
    const long relative = static_cast<long>(number) - body_first_line + 1;
    return relative >= 1 && relative < beyond_any_line ? static_cast<int>(relative) : 0;
  }
  return 0;
}

}  // namespace detail
}  // namespace gpupool
