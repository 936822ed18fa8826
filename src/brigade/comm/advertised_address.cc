#include "brigade/comm/advertised_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include "brigade/core/error.h"

namespace brigade {

bool is_loopback_literal(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6) != 0;
  return false;
}

std::string first_non_loopback_ipv4() {
  ifaddrs* head = nullptr;
  if (::getifaddrs(&head) != 0) return "";
  std::string found;
  for (const ifaddrs* a = head; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  ::freeifaddrs(head);
  return found;
}

AdvertisedAddress choose_advertised_address(const std::string& store_host,
                                            const std::string& store_local_address) {
  const std::string via = fmt::format(
      "the local end of this rank's connection to the "
      "rendezvous store at {}",
      store_host);
  if (!store_local_address.empty() && !is_loopback_literal(store_local_address)) {
    return {store_local_address, via};
  }
  if (!store_local_address.empty() && is_loopback_literal(store_host)) {
    return {store_local_address, via + ", a loopback address: every node is on this machine"};
  }
  if (std::string other = first_non_loopback_ipv4(); !other.empty()) {
    return {other, fmt::format("the first non-loopback interface that is up: the store at {} "
                               "was reached from '{}' here, which other nodes cannot reach",
                               store_host, store_local_address)};
  }
  if (store_local_address.empty()) {
    throw_error(
        "cannot tell which address to listen on for gloo peers: no interface is up besides "
        "loopback, and the connection to the store at {} has no local address; name an "
        "interface with GLOO_SOCKET_IFNAME or `brigade launch --iface NAME`",
        store_host);
  }
  return {store_local_address,
          fmt::format("{} resolves to loopback {} here, and no other interface is up", store_host,
                      store_local_address)};
}

}  // namespace brigade
