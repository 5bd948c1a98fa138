// Subcommands implemented in Python (they time torch modules): `packpipe profile`; and Python
// helpers the CLI runs as a child (pictures drawn with matplotlib: `costmodel validate --plot`). The CLI hands
// its arguments to the packpipe Python package under the interpreter the build was configured with
// (PACKPIPE_PYTHON_EXECUTABLE), with the build's module first on PYTHONPATH; PACKPIPE_PYTHON and
// PACKPIPE_PYTHONPATH override both for an installed or relocated tree.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "common/errors.h"

namespace packpipe::cli {

namespace {

#ifndef PACKPIPE_CLI_PYTHON
#define PACKPIPE_CLI_PYTHON ""
#endif
#ifndef PACKPIPE_CLI_PYTHON_DIR
#define PACKPIPE_CLI_PYTHON_DIR ""
#endif

// The interpreter and argv of `python -m module args...`, with PYTHONPATH set for the package.
std::vector<std::string> python_argv(const std::string& module, const std::vector<std::string>& args,
                                     const std::string& what) {
  const char* py_env = std::getenv("PACKPIPE_PYTHON");
  const std::string python = py_env != nullptr && *py_env != '\0' ? py_env : PACKPIPE_CLI_PYTHON;
  PACKPIPE_CHECK(!python.empty(), "this packpipe was built without the Python module (PACKPIPE_BUILD_PYTHON=OFF), "
                 "which {} needs; set PACKPIPE_PYTHON to an interpreter that imports packpipe",
                 what);
  const char* dir_env = std::getenv("PACKPIPE_PYTHONPATH");
  const std::string dir = dir_env != nullptr && *dir_env != '\0' ? dir_env : PACKPIPE_CLI_PYTHON_DIR;
  if (!dir.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old != nullptr && *old != '\0' ? dir + ":" + old : dir;
    ::setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<std::string> argv_s{python, "-m", module};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  return argv_s;
}

std::vector<char*> c_argv(std::vector<std::string>& argv_s) {
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

// Replaces this process with `python -m module args...`; returns only on failure (Error).
[[noreturn]] void exec_python_module(const std::string& module, const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = python_argv(module, args, fmt::format("`packpipe {}`", module));
  std::vector<char*> argv = c_argv(argv_s);
  ::execv(argv_s[0].c_str(), argv.data());
  PACKPIPE_THROW(Error, "could not start {} for `packpipe {}`: {}", argv_s[0], module, std::strerror(errno));
}

}  // namespace

void run_python_module(const std::string& module, const std::vector<std::string>& args, const std::string& what) {
  std::vector<std::string> argv_s = python_argv(module, args, what);
  std::vector<char*> argv = c_argv(argv_s);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  PACKPIPE_CHECK(pid >= 0, "could not start {} for {}: {}", argv_s[0], what, std::strerror(errno));
  if (pid == 0) {
    ::dup2(STDERR_FILENO, STDOUT_FILENO);  // the caller's stdout stays its own (--json)
    ::execv(argv_s[0].c_str(), argv.data());
    std::fprintf(stderr, "error: could not start %s for %s: %s\n", argv_s[0].c_str(), what.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    PACKPIPE_CHECK(errno == EINTR, "waiting for {} ({}) failed: {}", argv_s[0], what, std::strerror(errno));
  }
  PACKPIPE_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "{} failed ({} -m {} {}; see its message above)",
                 what, argv_s[0], module,
                 WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                                   : fmt::format("signal {}", WTERMSIG(status)));
}

void register_python_commands(CLI::App& app) {
  auto* profile = app.add_subcommand(
      "profile", "Measure a model's layers on this device for the profiled cost model (Python over torch; "
                 "`packpipe profile --help` lists its options)");
  profile->allow_extras();
  profile->prefix_command();  // every argument after `profile` goes to the Python command, --help included
  profile->set_help_flag();
  profile->callback([profile] { exec_python_module("packpipe.torch.profile", profile->remaining()); });
}

}  // namespace packpipe::cli
