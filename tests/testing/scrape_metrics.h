// Reads a server's Prometheus /metrics page over plain HTTP, for tests of real server processes.
#ifndef KVTIER_TESTS_TESTING_SCRAPE_METRICS_H_
#define KVTIER_TESTS_TESTING_SCRAPE_METRICS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

namespace kvtier::testing {

// GET http://127.0.0.1:port/metrics; returns the whole response ("" when nothing answers).
inline std::string ScrapeMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// The value of the sample named exactly `series` (name and labels as exposed, e.g.
// kvtier_transfer_errors_total{direction="write"}) in a scraped page; -1 when it is absent.
inline double MetricValue(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 && line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return -1;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_SCRAPE_METRICS_H_
