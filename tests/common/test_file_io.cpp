#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/mapped_file.h"
#include "tests/support/temp_dir.h"

using Catch::Matchers::Contains;
using packpipe::test::read_file;
using packpipe::test::TempDir;
using packpipe::test::write_file;

namespace {

int count_entries(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("AtomicFile replaces the output only on commit", "[file_io]") {
  TempDir dir;
  const std::string out = dir.file("out.txt");
  write_file(out, "old contents");
  {
    packpipe::AtomicFile f(out);
    f.write("new");
    REQUIRE(read_file(out) == "old contents");  // not visible before commit
    f.commit();
  }
  REQUIRE(read_file(out) == "new");
  REQUIRE(count_entries(dir.path()) == 1);  // no temporary, no lock file left
  {
    packpipe::AtomicFile f(out);
    f.write("half written");
    // destroyed without commit: a failed run
  }
  REQUIRE(read_file(out) == "new");
  REQUIRE(count_entries(dir.path()) == 1);
  packpipe::write_file_atomic(dir.file("fresh"), "x");
  REQUIRE(read_file(dir.file("fresh")) == "x");
}

TEST_CASE("AtomicFile refuses a second concurrent writer of one path", "[file_io][negative]") {
  TempDir dir;
  const std::string out = dir.file("plan.bin");
  packpipe::AtomicFile first(out);
  REQUIRE_THROWS_WITH(packpipe::AtomicFile(out), Contains("another process is writing") && Contains("plan.bin"));
  // Another process too (flock is per open file description, so a child sees the lock).
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      packpipe::AtomicFile second(out);
      ::_exit(0);
    } catch (const packpipe::Error&) {
      ::_exit(3);
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 3);
  first.write("a");
  first.commit();
  packpipe::AtomicFile again(out);  // free once the first is done
  again.discard();
  REQUIRE(read_file(out) == "a");
}

TEST_CASE("AtomicFile refuses a directory as its output, and writes a stream directly", "[file_io][negative]") {
  TempDir dir;
  REQUIRE_THROWS_WITH(packpipe::AtomicFile(dir.path()), Contains("is a directory"));
  packpipe::AtomicFile null("/dev/null");  // e.g. --report /dev/stdout: no file to replace
  null.write("discarded");
  null.commit();
  REQUIRE(count_entries(dir.path()) == 0);
}

TEST_CASE("an output that resolves to an input is refused", "[file_io][negative]") {
  TempDir dir;
  const std::string in = dir.file("data.idx");
  write_file(in, "payload");
  REQUIRE(::symlink(in.c_str(), dir.file("link.idx").c_str()) == 0);
  REQUIRE(::link(in.c_str(), dir.file("hard.idx").c_str()) == 0);
  REQUIRE(packpipe::same_file(in, dir.file("link.idx")));
  REQUIRE(packpipe::same_file(in, dir.file("hard.idx")));
  REQUIRE(packpipe::same_file(in, dir.path() + "/./data.idx"));
  REQUIRE_FALSE(packpipe::same_file(in, dir.file("missing")));
  for (const char* name : {"data.idx", "link.idx", "hard.idx", "./data.idx"}) {
    const std::string out = dir.path() + "/" + name;
    REQUIRE_THROWS_AS(packpipe::check_output_is_not_input(out, {dir.file("other"), in}, "--out"),
                      packpipe::InvalidArgument);
  }
  REQUIRE_THROWS_WITH(packpipe::check_output_is_not_input(dir.file("link.idx"), {in}, "--out"),
                      Contains("--out") && Contains("destroy the input"));
  REQUIRE_NOTHROW(packpipe::check_output_is_not_input(dir.file("new.idx"), {in}, "--out"));
  REQUIRE(read_file(in) == "payload");
}

TEST_CASE("check_command_files: outputs distinct from the inputs and from each other, existing or not",
          "[file_io][negative][regression]") {
  TempDir dir;
  const std::string in = dir.file("data.jsonl");
  write_file(in, "payload");
  using packpipe::check_command_files;
  using Outs = std::vector<packpipe::OutputFile>;
  // Two outputs of one command at one path, neither existing yet: by path after resolving "." and "..".
  REQUIRE_THROWS_WITH(check_command_files({in}, Outs{{dir.file("out_inputs_document.idx"), "output dataset file"},
                                                     {dir.path() + "/./sub/../out_inputs_document.idx", "--manifest"}}),
                      Contains("output dataset file") && Contains("--manifest") && Contains("are the same file"));
  // The same through a symbolic link to the folder.
  REQUIRE(::symlink(dir.path().c_str(), dir.file("alias").c_str()) == 0);
  REQUIRE_THROWS_WITH(check_command_files({in}, Outs{{dir.file("p.json"), "--out"}, {dir.file("alias/p.json"), "--report"}}),
                      Contains("are the same file"));
  // An output that is an input, and one whose writer's lock file would be the input.
  REQUIRE_THROWS_WITH(check_command_files({in}, Outs{{in, "--out"}}), Contains("destroy the input"));
  const std::string lock_input = dir.file("model.json.lock");
  write_file(lock_input, "a user's file");
  REQUIRE_THROWS_WITH(check_command_files({lock_input}, Outs{{dir.file("model.json"), "--out"}}),
                      Contains("lock file") && Contains("destroy the input"));
  // An output that is another output's lock file.
  REQUIRE_THROWS_WITH(check_command_files({in}, Outs{{dir.file("a"), "--out"}, {dir.file("a.lock"), "--trace"}}),
                      Contains("are the same file"));
  // Streams are written in place: /dev/null twice loses nothing.
  REQUIRE_NOTHROW(check_command_files({in}, Outs{{"/dev/null", "--out"}, {"/dev/null", "--trace"}, {"", "--report"}}));
  REQUIRE_NOTHROW(check_command_files({in}, Outs{{dir.file("x"), "--out"}, {dir.file("y"), "--trace"}}));
  REQUIRE(read_file(in) == "payload");
  REQUIRE(read_file(lock_input) == "a user's file");
}

TEST_CASE("open_regular_file refuses FIFOs without blocking, and directories", "[file_io][negative]") {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE_THROWS_WITH(packpipe::read_regular_file(fifo, "lengths file"), Contains("a FIFO") && Contains("lengths file"));
  REQUIRE_THROWS_WITH(packpipe::MappedFile(fifo), Contains("a FIFO"));
  REQUIRE_THROWS_WITH(packpipe::read_regular_file(dir.path(), "lengths file"), Contains("a directory"));
  write_file(dir.file("ok"), "12\n34\n");
  REQUIRE(packpipe::read_regular_file(dir.file("ok"), "lengths file") == "12\n34\n");
}

TEST_CASE("parse_json refuses duplicate keys and deep nesting, naming the source", "[json][negative]") {
  REQUIRE(packpipe::parse_json(R"({"a": {"b": [1, {"c": 2}]}, "d": 3})", "x.json")["a"]["b"][1]["c"] == 2);
  REQUIRE_THROWS_WITH(packpipe::parse_json(R"({"position": 5, "position": 0})", "state.json"),
                      Contains("state.json") && Contains("duplicate key \"position\""));
  REQUIRE_THROWS_WITH(packpipe::parse_json(R"({"tasks": [{"name": "a", "x": 1, "name": "b"}]})", "m.json"),
                      Contains("duplicate key \"name\"") && Contains("/tasks/[]"));
  // The same key in sibling objects is fine.
  REQUIRE_NOTHROW(packpipe::parse_json(R"([{"a": 1}, {"a": 2}])", "s"));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  REQUIRE_THROWS_WITH(packpipe::parse_json(deep, "deep.json"), Contains("deep.json") && Contains("deeper than 64"));
  const std::string ok_depth = std::string(64, '[') + std::string(64, ']');
  REQUIRE_NOTHROW(packpipe::parse_json(ok_depth, "s"));
  REQUIRE_THROWS_WITH(packpipe::parse_json(std::string(65, '[') + std::string(65, ']'), "s"), Contains("deeper"));
  REQUIRE_THROWS_WITH(packpipe::parse_json("{\n\"a\": 1,\n\"b\": }", "bad.json"),
                      Contains("bad.json") && Contains("line 3"));
}

TEST_CASE("a mapped file truncated by another process is an Error, not SIGBUS", "[file_io][negative]") {
  TempDir dir;
  const std::string path = dir.file("data.bin");
  write_file(path, std::string(3 * 65536, 'x'));
  packpipe::MappedFile m(path);
  std::string buf(100, '\0');
  m.read(2 * 65536, 100, buf.data());
  REQUIRE(buf == std::string(100, 'x'));
  REQUIRE_NOTHROW(m.check_unchanged());
  REQUIRE(::truncate(path.c_str(), 100) == 0);  // as another process would
  REQUIRE_THROWS_WITH(m.check_unchanged(), Contains("data.bin") && Contains("100 bytes now"));
  REQUIRE_THROWS_WITH(m.read(2 * 65536, 100, buf.data()),
                      Contains("data.bin") && Contains("SIGBUS") && Contains("is 100 now"));
  // Still usable for the part that exists.
  m.read(0, 10, buf.data());
  REQUIRE(buf.substr(0, 10) == std::string(10, 'x'));
  REQUIRE_THROWS_AS(m.read(3 * 65536, 1, buf.data()), packpipe::OutOfRange);
}

TEST_CASE("an unguarded access to a truncated mapping names the file before the process ends",
          "[file_io][negative]") {
  TempDir dir;
  const std::string path = dir.file("victim.idx");
  write_file(path, std::string(3 * 65536, 'x'));
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 2);
    packpipe::MappedFile m(path);
    if (::truncate(path.c_str(), 10) != 0) ::_exit(9);
    volatile std::uint8_t v = m.data()[2 * 65536];  // SIGBUS
    (void)v;
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string err;
  char b[512];
  for (ssize_t r; (r = ::read(fds[0], b, sizeof(b))) > 0;) err.append(b, static_cast<std::size_t>(r));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // It ends by a signal: SIGBUS by default, or whatever the handler installed before packpipe's
  // makes of it (Catch2's own reports and re-raises; under ASan it aborts).
  REQUIRE(WIFSIGNALED(status));
  REQUIRE((WTERMSIG(status) == SIGBUS || WTERMSIG(status) == SIGABRT));
  REQUIRE_THAT(err, Contains("victim.idx") && Contains("truncated or overwritten"));
}
