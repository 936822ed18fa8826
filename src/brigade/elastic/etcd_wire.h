// What etcd_store.cc and etcd_election.cc share of etcd's v3 JSON gateway:
// keys and values travel in base64, int64s as decimal strings, and every
// reply is checked as it is read. Not for other users: they go through
// EtcdCoordinatorStore.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace brigade::elastic::etcd_wire {

std::string to_base64(const std::string& in);
// nullopt for anything but canonical padded base64.
std::optional<std::string> from_base64(const std::string& in);
// A reply quoted in an error: printable, short.
std::string shown_reply(const std::string& text);
// A JSON integer as the gateway writes it: int64 as a decimal string.
int64_t reply_int(const nlohmann::json& j, const char* field, const std::string& where);
// The reply's JSON; throws Error naming `where` unless it is etcd's.
nlohmann::json etcd_reply(const std::string& text, const std::string& where);
// A transaction's outcome ("succeeded" is left out when false).
bool txn_succeeded(const nlohmann::json& j, const std::string& where);

}  // namespace brigade::elastic::etcd_wire
