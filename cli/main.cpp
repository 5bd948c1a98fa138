// packpipe command-line entry point: registers the subcommands and maps errors to exit codes.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/config.h"

int main(int argc, char** argv) {
  CLI::App app{"packpipe: dynamic micro-batching and pipeline planning for multi-task training"};
  app.set_version_flag("--version", std::string("packpipe ") + PACKPIPE_VERSION);
  app.require_subcommand(1);
  packpipe::cli::register_dataset_commands(app);
  packpipe::cli::register_costmodel_commands(app);
  packpipe::cli::register_pack_commands(app);
  packpipe::cli::register_partition_commands(app);
  packpipe::cli::register_schedule_commands(app);
  packpipe::cli::register_plan_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "packpipe: error: %s\n", e.what());
    return 1;
  }
  return packpipe::cli::exit_status();
}
