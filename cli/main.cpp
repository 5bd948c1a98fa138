// packpipe command-line entry point: registers the subcommands and maps errors to exit codes.
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
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
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "packpipe: error: %s\n", e.what());
    return 1;
  }
  return packpipe::cli::exit_status();
}
