#include "apps/launcher_ssh.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "apps/output_relay.h"
#include "transport/link.h"
#include "troupe/error.h"

namespace troupe::apps::launch_detail {
namespace {

bool isLoopbackName(const std::string& host) {
  return host == "localhost" || host == "ip6-localhost" || host == "::1" ||
         host.rfind("127.", 0) == 0;
}

// The local address packets to `host` leave from (a UDP connect sends nothing).
std::string routeSourceAddress(const LaunchHost& host, const std::string& hostfile) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.name.c_str(), "9", &hints, &found); rc != 0) {
    throw InputError(fmt::format("-H {}:{}: cannot resolve host '{}': {}", hostfile, host.line,
                                 host.name, ::gai_strerror(rc)));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (!ok) {
    throw IoError(fmt::format("no route to host '{}' (-H {}:{}) for the rendezvous store: {}",
                              host.name, hostfile, host.line, std::strerror(err)));
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

std::vector<std::string> splitWords(const char* text) {
  std::vector<std::string> words;
  std::string word;
  for (const char* p = text; p && *p; ++p) {
    if (std::isspace(static_cast<unsigned char>(*p))) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += *p;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

// The shell line an ssh process runs remotely; see launcher.h.
std::string remoteScript(const std::string& dir, const Env& env,
                         const std::vector<std::string>& command) {
  std::string script = fmt::format("cd {} && echo {} pid $$ && env", shellQuote(dir), kMarker);
  for (const auto& [k, v] : env)
    script += " " + shellQuote(k + "=" + v);
  script += " " + join(command);
  script += fmt::format("; rc=$?; echo {} exit $rc; exit $rc", kMarker);
  return script;
}

}  // namespace

std::vector<std::string> userSshOptions(const LaunchOptions& o) {
  auto opts = splitWords(std::getenv("TROUPE_SSH_OPTS"));
  opts.insert(opts.end(), o.ssh_options.begin(), o.ssh_options.end());
  return opts;
}

std::vector<std::string> sshCommand(const std::vector<std::string>& user_options,
                                    const LaunchHost& host) {
  std::vector<std::string> cmd{"ssh"};
  cmd.insert(cmd.end(), user_options.begin(), user_options.end());
  for (const char* opt :
       {"BatchMode=yes", "StrictHostKeyChecking=no", "ConnectTimeout=20", "LogLevel=ERROR"}) {
    cmd.push_back("-o");
    cmd.push_back(opt);
  }
  if (host.port) {
    cmd.push_back("-p");
    cmd.push_back(std::to_string(host.port));
  }
  return cmd;
}

std::vector<std::string> sshRun(const std::vector<std::string>& user_options,
                                const LaunchHost& host, const std::string& script) {
  auto cmd = sshCommand(user_options, host);
  cmd.push_back(host.name);
  cmd.push_back(script);
  return cmd;
}

void syncFolder(const std::vector<LaunchHost>& hosts, const std::vector<std::string>& user_options,
                const std::string& dir, const std::string& hostfile, OutputRelay& relay) {
  const std::string here = std::filesystem::current_path().string();
  std::vector<std::string> done;
  for (const auto& h : hosts) {
    if (std::find(done.begin(), done.end(), h.display()) != done.end()) continue;
    done.push_back(h.display());
    relay.out("[launcher] syncing {} to {}:{}", here, h.display(), dir);
    const std::string label = "sync " + h.display();
    const auto mkdir = runAll({sshRun(user_options, h, "mkdir -p " + shellQuote(dir))},
                              std::chrono::minutes(2), &relay, {label})[0];
    if (!WIFEXITED(mkdir) || WEXITSTATUS(mkdir) != 0) {
      throw IoError(fmt::format("--sync-dst-dir: cannot create {} on host {} (-H {}:{}): ssh {}",
                                dir, h.display(), hostfile, h.line, describeExit(mkdir)));
    }
    const auto rsync = runAll(
        {{"rsync", "-az", "-e", join(sshCommand(user_options, h)), "./", h.name + ":" + dir + "/"}},
        std::chrono::hours(1), &relay, {label})[0];
    if (!WIFEXITED(rsync) || WEXITSTATUS(rsync) != 0) {
      throw IoError(fmt::format("--sync-dst-dir: rsync of {} to host {}:{} (-H {}:{}) {}", here,
                                h.display(), dir, hostfile, h.line, describeExit(rsync)));
    }
  }
}

Spawned spawnSsh(const std::vector<std::string>& ssh_options, const LaunchHost& host,
                 const std::string& dir, Env env, const std::vector<std::string>& command) {
  std::string secret;
  const auto it = std::find_if(env.begin(), env.end(),
                               [](const auto& kv) { return kv.first == "TROUPE_SECRET"; });
  if (it != env.end()) {
    secret = it->second;
    env.erase(it);
  }
  std::string script = remoteScript(dir, env, command);
  if (!secret.empty()) script = "IFS= read -r TROUPE_SECRET && export TROUPE_SECRET && " + script;
  return spawnPiped(sshRun(ssh_options, host, script), {}, secret.empty() ? "" : secret + "\n");
}

std::string storeBindAddress(const LaunchOptions& o, const std::vector<LaunchHost>& hosts) {
  std::string interface = o.interface;
  if (interface.empty()) {
    if (const char* env = std::getenv("TROUPE_INTERFACE")) interface = env;
  }
  if (!interface.empty()) return transport::resolveInterface(interface);
  for (const auto& h : hosts) {
    if (!isLoopbackName(h.name)) return routeSourceAddress(h, o.hostfile);
  }
  return "127.0.0.1";
}

}  // namespace troupe::apps::launch_detail
