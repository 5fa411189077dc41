// What the C++ programs of `gpupool compare` share: their options, the timing loop (one warm-up,
// then between --min-repeat and --repeat timed runs, stopping past --seconds), the inputs, and
// one JSON object per line on standard output for the Python side to read.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace compare {

struct options {
  std::string workload = "W1";
  std::size_t chunks = 5;
  std::size_t size = 1000000;
  int fmas = 2048;
  int repeat = 7;
  int min_repeat = 3;
  double seconds = 1.5;
  std::string backend;
  std::vector<int> lanes_list;
  std::vector<std::size_t> chunk_list;
  std::vector<int> threads_list;
  std::vector<int> host_lanes_list;
};

// The whole of `text` as a number of type T, or std::invalid_argument saying what it is
// instead (a sign, a fraction or digits past T's range included).
template <class T>
T to_number(const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range)
    throw std::invalid_argument("takes a smaller number, not " + text);
  if (text.empty() || error != std::errc() || stop != end)
    throw std::invalid_argument("takes a number, not '" + text + "'");
  if constexpr (std::is_floating_point_v<T>) {
    // from_chars reads "inf" and "nan" as numbers; no option of a benchmark means either.
    if (!std::isfinite(value))
      throw std::invalid_argument("takes a finite number, not '" + text + "'");
  }
  return value;
}

// A comma-separated list of positive numbers ("4,8,16"); an empty list is refused, since
// leaving the option out is how a program's default is asked for.
template <class T>
std::vector<T> parse_list(const std::string& text) {
  std::vector<T> out;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(start, end - start);
    if (!part.empty()) {
      const T value = to_number<T>(part);
      if (!(value > 0)) throw std::invalid_argument("takes positive numbers, not " + part);
      out.push_back(value);
    }
    start = end + 1;
  }
  if (out.empty()) throw std::invalid_argument("takes a list of numbers, such as 4,8,16");
  return out;
}

// One option of a benchmark's command line: its flag and what its value sets.
struct option {
  std::string_view flag;
  std::function<void(const std::string& value)> set;
};

// Reads every "--flag value" of the command line into what `known` sets. For -h or --help,
// prints `usage` and exits 0; for a flag not in `known`, one with no value after it, or a value
// its setter refuses (std::invalid_argument), says which flag and why and exits 2.
inline void read_options(int argc, char** argv, const char* usage,
                         std::initializer_list<option> known) {
  std::string flag;
  try {
    for (int i = 1; i < argc; ++i) {
      flag = argv[i];
      if (flag == "-h" || flag == "--help") {
        std::fputs(usage, stdout);
        std::exit(0);
      }
      const auto it =
          std::find_if(known.begin(), known.end(), [&](const option& o) { return o.flag == flag; });
      if (it == known.end()) throw std::invalid_argument("is not an option");
      if (i + 1 >= argc) throw std::invalid_argument("needs a value");
      it->set(argv[++i]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s (--help lists the options)\n", flag.c_str(), e.what());
    std::exit(2);
  }
}

// The options of gpupool_bench_compare and gpupool_baseline_pipeline (see read_options).
inline options parse(int argc, char** argv, const char* usage) {
  options o;
  read_options(
      argc, argv, usage,
      {{"--workload", [&](const std::string& v) { o.workload = v; }},
       {"--chunks", [&](const std::string& v) { o.chunks = to_number<std::size_t>(v); }},
       {"--size", [&](const std::string& v) { o.size = to_number<std::size_t>(v); }},
       {"--fmas", [&](const std::string& v) { o.fmas = to_number<int>(v); }},
       {"--repeat", [&](const std::string& v) { o.repeat = to_number<int>(v); }},
       {"--min-repeat", [&](const std::string& v) { o.min_repeat = to_number<int>(v); }},
       {"--seconds", [&](const std::string& v) { o.seconds = to_number<double>(v); }},
       {"--backend", [&](const std::string& v) { o.backend = v; }},
       {"--lanes-list", [&](const std::string& v) { o.lanes_list = parse_list<int>(v); }},
       {"--chunk-list", [&](const std::string& v) { o.chunk_list = parse_list<std::size_t>(v); }},
       {"--threads-list", [&](const std::string& v) { o.threads_list = parse_list<int>(v); }},
       {"--host-lanes-list",
        [&](const std::string& v) { o.host_lanes_list = parse_list<int>(v); }}});
  if (o.chunks == 0 || o.size == 0 || o.fmas < 1 || o.repeat < 1 || o.min_repeat < 1 ||
      !(o.seconds > 0)) {
    std::fprintf(stderr, "chunks, size, FMAs, repeats and seconds must be positive\n");
    std::exit(2);
  }
  o.min_repeat = std::min(o.min_repeat, o.repeat);
  return o;
}

// Deterministic inputs in [-10, 10) without a slow generator (W2 has 200 million of them).
template <class T>
void fill(std::vector<T>& v, std::size_t salt) {
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<T>(static_cast<double>((i * 2654435761u + salt * 40503u) % 20000u) * 0.001 -
                          10.0);
}

// The FMA chain on the CPU, in double (the GPU fuses each step): v = v * 0.999 + 0.001 (W5), or
// v = v * 0.999 + x (W6c: the result depends on the input however long the chain).
inline double fma_chain(double x, int fmas, bool add_input = false) {
  const double addend = add_input ? x : 0.001;
  for (int i = 0; i < fmas; ++i) x = x * 0.999 + addend;
  return x;
}
inline bool fma_close(double got, double want) {
  return std::abs(got - want) <= 1e-4 * (1.0 + std::abs(want));
}

using clock_type = std::chrono::steady_clock;

// Runs `run` once (warm-up) and `check()`s; then times it; checks again after the last run.
// Returns the seconds of each timed run, or an empty list (and `why`) when a check failed.
template <class Run, class Check>
std::vector<double> timed(const options& o, Run&& run, Check&& check, std::string& why) {
  run();
  why = check();
  if (!why.empty()) return {};
  std::vector<double> seconds;
  const auto started = clock_type::now();
  while (static_cast<int>(seconds.size()) < o.repeat) {
    const auto t0 = clock_type::now();
    run();
    seconds.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    if (static_cast<int>(seconds.size()) >= o.min_repeat &&
        std::chrono::duration<double>(clock_type::now() - started).count() > o.seconds)
      break;
  }
  why = check();
  if (!why.empty()) return {};
  return seconds;
}

inline std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out;
}

inline std::string number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

// One measurement as a JSON line. `amount` is what the unit counts per second (GB of input for
// GB/s, tasks for tasks/s); `settings` is a JSON object's text.
inline void emit(const std::string& workload, const std::string& variant, const std::string& kind,
                 const std::string& unit, double amount, const std::vector<double>& seconds,
                 const std::string& why, const std::string& settings = "{}", bool sweep = false) {
  std::string line = "{\"workload\": \"" + escape(workload) + "\", \"variant\": \"" +
                     escape(variant) + "\", \"kind\": \"" + kind + "\", \"unit\": \"" + unit +
                     "\", \"amount\": " + number(amount) + ", \"settings\": " + settings +
                     ", \"sweep\": " + (sweep ? "true" : "false");
  if (!why.empty() || seconds.empty()) {
    line += ", \"status\": \"FAILED\", \"reason\": \"" +
            escape(why.empty() ? std::string("no timed runs") : why) + "\"}";
  } else {
    line += ", \"status\": \"ok\", \"repeats_s\": [";
    for (std::size_t i = 0; i < seconds.size(); ++i) {
      char number[32];
      std::snprintf(number, sizeof number, "%s%.9f", i ? ", " : "", seconds[i]);
      line += number;
    }
    line += "]}";
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// A measured value in its own unit (a limit): GB/s, us.
inline void emit_value(const std::string& variant, const std::string& unit, double value,
                       const std::string& limit_key) {
  std::printf(
      "{\"workload\": \"limits\", \"variant\": \"%s\", \"kind\": \"limit\", \"unit\": \"%s\", "
      "\"value\": %.6g, \"settings\": {\"limit\": \"%s\"}, \"status\": \"ok\"}\n",
      escape(variant).c_str(), unit.c_str(), value, limit_key.c_str());
  std::fflush(stdout);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

}  // namespace compare
