// Subcommand registration for the packpipe CLI; each subcommand lives in its own file.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace packpipe::cli {

/// `packpipe dataset info|verify|build|compress|decompress|merge`.
void register_dataset_commands(CLI::App& app);
/// `packpipe costmodel show|query|validate|import|calibrate` (creates the subcommand, adds the query
/// commands and calls add_costmodel_profile_commands).
void register_costmodel_commands(CLI::App& app);
/// Adds `validate` and `import` to the `costmodel` subcommand.
void add_costmodel_profile_commands(CLI::App& costmodel);
/// Adds `calibrate` to the `costmodel` subcommand.
void add_costmodel_calibration_commands(CLI::App& costmodel);
/// `packpipe partition`: micro-batches of one global batch by any method.
void register_partition_commands(CLI::App& app);
/// `packpipe pack`: pack sample lengths into rows.
void register_pack_commands(CLI::App& app);
/// `packpipe schedule`: simulate and search pipeline schedules for given micro-batches.
void register_schedule_commands(CLI::App& app);
/// `packpipe plan ...`: the planning job (creates the subcommand and calls add_plan_file_commands).
void register_plan_commands(CLI::App& app);
/// Adds `inspect`, `validate` and `export` to the `plan` subcommand.
void add_plan_file_commands(CLI::App& plan);
/// `packpipe run PLANFILE --replay`: execute a plan file's streams with no model.
void register_run_commands(CLI::App& app);
/// `packpipe profile`: subcommands implemented in Python (they run the packpipe Python package).
void register_python_commands(CLI::App& app);
/// Runs `python -m module args...` (the build's interpreter and package, as `packpipe profile`) as a
/// child with its stdout on this process's stderr, and waits; throws Error naming `what` when it
/// cannot start or does not exit 0.
void run_python_module(const std::string& module, const std::vector<std::string>& args, const std::string& what);
/// Exit status set by the subcommand that ran (0 unless it found a problem).
int exit_status();
/// Sets the exit status returned by main.
void set_exit_status(int status);

}  // namespace packpipe::cli
