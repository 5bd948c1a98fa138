// packpipe command-line entry point: registers the subcommands and maps errors to exit codes.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>
#include <system_error>
#include <exception>
#include <stdexcept>

#include <CLI/CLI.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cli/commands.h"
#include "cli/util.h"
#include "common/config.h"

namespace {

// Every numeric option of every subcommand, by its declared type: an unsigned option refuses a
// negative value (CLI11 would otherwise wrap -1 to 2^64-1) and every number refuses NaN and
// infinities. Per-option ranges are checked where each option is declared.
void check_numeric_options(CLI::App& app) {
  static const CLI::Validator non_negative(
      [](std::string& v) -> std::string {
        const auto p = v.find_first_not_of(" \t");
        return p != std::string::npos && v[p] == '-' ? "expected a value >= 0, found " + v : std::string();
      },
      "", "non-negative");
  static const CLI::Validator finite(
      [](std::string& v) -> std::string {
        std::string l;
        for (char c : v) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return l.find("nan") != std::string::npos || l.find("inf") != std::string::npos
                   ? "expected a finite number, found " + v
                   : std::string();
      },
      "", "finite");
  // A decimal integer past 64 bits: CLI11 saturates it (--seed 2^64 became 2^64 - 1 and
  // --first-iteration 2^64 + 1 the last iteration), so it is refused with what was typed.
  static const CLI::Validator in_64_bits(
      [](std::string& v) -> std::string {
        const auto p = v.find_first_not_of(" \t");
        if (p == std::string::npos) return {};
        const char* first = v.data() + p + (v[p] == '+' ? 1 : 0);
        const char* last = v.data() + v.size();
        std::int64_t i = 0;
        std::uint64_t u = 0;
        const bool negative = *first == '-';
        const auto ec = negative ? std::from_chars(first, last, i).ec : std::from_chars(first, last, u).ec;
        if (ec != std::errc::result_out_of_range) return {};
        return negative ? "expected a value >= -9223372036854775808, found " + v
                        : "expected a value <= 18446744073709551615, found " + v;
      },
      "", "64-bit");
  for (CLI::Option* opt : app.get_options()) {
    const std::string t = opt->get_type_name();
    if (t == "INT" || t == "UINT") opt->check(in_64_bits);
    if (t == "UINT") opt->check(non_negative);
    if (t == "FLOAT" || t == "INT" || t == "UINT") opt->check(finite);
    if (t == "FLOAT") {
      // Every floating option has its range (cli/util.h float_range); one without is a packpipe bug,
      // refused here so that no command starts with it.
      try {
        opt->get_validator(packpipe::cli::kFloatRangeName);
      } catch (const CLI::OptionNotFound&) {
        throw std::logic_error("packpipe: floating option " + opt->get_name() + " of `" + app.get_name() +
                               "` has no range (cli/util.h float_range)");
      }
    }
  }
  for (CLI::App* sub : app.get_subcommands({})) check_numeric_options(*sub);
}

// Levenshtein distance between two short words (option and subcommand names).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The closest of `names` to `word` when close enough to be a typo, else "".
std::string closest(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  std::size_t d = std::max<std::size_t>(2, word.size() / 3) + 1;
  for (const std::string& n : names) {
    const std::size_t e = edit_distance(word, n);
    if (e < d) {
      d = e;
      best = n;
    }
  }
  return best;
}

// CLI11's parse errors for a missing or unknown subcommand and for unknown arguments say neither
// which word was wrong nor what was expected ("A subcommand is required"; "The following arguments
// were not expected: 3 --iteration run.plan insepct"): these name the word, the command it was
// given to, what that command takes, and the closest name. Other errors are CLI11's.
int explain_parse_error(CLI::App& app, const CLI::ParseError& e) {
  const bool need_sub = dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
                        std::string(e.what()).find("ubcommand") != std::string::npos;
  const bool extras = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr;
  if (!need_sub && !extras) return app.exit(e);
  std::string path = "packpipe";
  CLI::App* at = &app;
  for (;;) {
    const auto subs = at->get_subcommands();
    if (subs.empty()) break;
    at = subs.front();
    path += " " + at->get_name();
  }
  std::vector<std::string> subs, opts;
  for (const CLI::App* s : at->get_subcommands({})) subs.push_back(s->get_name());
  for (const CLI::Option* o : at->get_options()) {
    for (const std::string& n : o->get_lnames()) opts.push_back("--" + n);
  }
  const std::vector<std::string> rest = at->remaining();
  // The word to name: a first plain word close to a subcommand (a mistyped one: the words after it
  // belong to it), else an unknown option, else the first word.
  std::string word;
  for (const std::string& x : rest) {
    if (!x.empty() && x[0] != '-') {
      if (!closest(x, subs).empty()) word = x;
      break;
    }
  }
  for (const std::string& x : rest) {
    if (!word.empty()) break;
    if (!x.empty() && x[0] == '-') word = x.substr(0, x.find('='));
  }
  if (word.empty() && !rest.empty()) word = rest.front();
  std::string msg;
  if (!word.empty() && word[0] == '-') {
    const std::string near = closest(word, opts);
    msg = "unknown option '" + word + "' for `" + path + "`" + (near.empty() ? "" : "; did you mean " + near + "?");
  } else if (!subs.empty()) {
    std::string list;
    for (const std::string& n : subs) list += (list.empty() ? "" : ", ") + n;
    const std::string near = word.empty() ? std::string() : closest(word, subs);
    msg = (word.empty() ? "`" + path + "` needs a subcommand" : "unknown subcommand '" + word + "' of `" + path + "`") +
          ": expected one of " + list + (near.empty() ? "" : "; did you mean " + near + "?");
  } else {
    msg = std::string(e.what()) + " (`" + path + "`)";
  }
  std::fprintf(stderr, "packpipe: error: %s\nRun `%s --help` for more information.\n", msg.c_str(), path.c_str());
  return e.get_exit_code();
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // Keep up to 64 MiB freed at the heap top rather than returning it: planning allocates and frees
  // the same few MB every iteration, and trimming at glibc's default (128 KiB) made the kernel
  // fault those pages back in each time (about a tenth of the demo's planning time). Setting it
  // turns off glibc's adaptive mmap threshold, so that is set too (blocks up to 32 MiB from the
  // heap, not mapped and unmapped per use). A process setting of the CLI's own, left to the user's
  // when they tune malloc; the library leaves its host's allocator alone.
  if (std::getenv("GLIBC_TUNABLES") == nullptr && std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr &&
      std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
  }
#endif
  CLI::App app{"packpipe: dynamic micro-batching and pipeline planning for multi-task training"};
  app.set_version_flag("--version", std::string("packpipe ") + PACKPIPE_VERSION);
  app.require_subcommand(1);
  packpipe::cli::register_dataset_commands(app);
  packpipe::cli::register_costmodel_commands(app);
  packpipe::cli::register_pack_commands(app);
  packpipe::cli::register_partition_commands(app);
  packpipe::cli::register_schedule_commands(app);
  packpipe::cli::register_plan_commands(app);
  packpipe::cli::register_run_commands(app);
  packpipe::cli::register_python_commands(app);
  try {
    check_numeric_options(app);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return explain_parse_error(app, e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "packpipe: error: %s\n", e.what());
    return 1;
  }
  return packpipe::cli::exit_status();
}
