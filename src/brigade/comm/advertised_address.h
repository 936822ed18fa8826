// Which address a rank of a multi-node Gloo group listens on, and gives its
// peers, when nobody named an interface (GLOO_SOCKET_IFNAME, `brigade launch
// --iface`).
//
// Not this host's name: /etc/hosts often maps it to a loopback address
// (127.0.1.1 on Debian, 127.0.0.1 in many containers), which peers on other
// nodes cannot reach. Instead, the local end of the rank's connection to the
// rendezvous store: the address of the interface that routes to the store's
// host, so peers that reach that host, as every node must, reach this one too.
//
// That end is a loopback address only when the store was reached over
// loopback. If the store's host was given as one (127.0.0.1, ::1, localhost),
// every node is on this machine and loopback is right. If it was a name that
// merely resolves to loopback here (node 0 named by its own name), the peers
// are elsewhere: the first non-loopback IPv4 interface that is up is taken
// instead, and loopback only when there is none (then no peer can be
// elsewhere).
#pragma once

#include <string>

namespace brigade {

struct AdvertisedAddress {
  std::string address;  // numeric
  std::string reason;   // how it was chosen, for error messages
};

// store_host: the rendezvous host as given (MASTER_ADDR); store_local_address:
// the numeric local end of this process's connection to it.
AdvertisedAddress choose_advertised_address(const std::string& store_host,
                                            const std::string& store_local_address);

// Whether `host` is written as a loopback address: 127.x.y.z, ::1 or
// localhost. Names are not resolved.
bool is_loopback_literal(const std::string& host);

// The address of the first interface that is up and has a non-loopback IPv4
// address, or "" when there is none.
std::string first_non_loopback_ipv4();

}  // namespace brigade
