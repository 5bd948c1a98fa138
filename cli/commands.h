// Subcommand registration for the packpipe CLI; each subcommand lives in its own file.
#pragma once

#include <CLI/CLI.hpp>

namespace packpipe::cli {

/// `packpipe dataset info|verify|build|compress|decompress|merge`.
void register_dataset_commands(CLI::App& app);
/// Exit status set by the subcommand that ran (0 unless it found a problem).
int exit_status();
/// Sets the exit status returned by main.
void set_exit_status(int status);

}  // namespace packpipe::cli
