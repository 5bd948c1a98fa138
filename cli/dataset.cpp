#include "cli/commands.h"

namespace packpipe::cli {

namespace {
int g_exit_status = 0;
}

int exit_status() { return g_exit_status; }
void set_exit_status(int status) { g_exit_status = status; }

void register_dataset_commands(CLI::App& app) { (void)app; }

}  // namespace packpipe::cli
