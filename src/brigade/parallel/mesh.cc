#include "brigade/parallel/mesh.h"

#include <fmt/format.h>

#include <algorithm>

#include "brigade/core/config.h"
#include "brigade/core/error.h"

namespace brigade {

const char* mesh_dim_name(MeshDim dim) {
  switch (dim) {
    case MeshDim::kData:
      return "dp";
    case MeshDim::kTensor:
      return "tp";
    case MeshDim::kPipeline:
      return "pp";
  }
  return "?";
}

MeshShape MeshShape::from_config(Config& config) {
  MeshShape s;
  s.dp = static_cast<int>(config.get_int("parallel.dp", s.dp));
  s.tp = static_cast<int>(config.get_int("parallel.tp", s.tp));
  s.pp = static_cast<int>(config.get_int("parallel.pp", s.pp));
  for (auto [name, v] : {std::pair{"dp", s.dp}, {"tp", s.tp}, {"pp", s.pp}}) {
    if (v <= 0) throw_error("parallel.{} must be at least 1, got {}", name, v);
  }
  return s;
}

Mesh::Mesh(MeshShape shape, int world_size) : shape_(shape) {
  if (shape.dp <= 0 || shape.tp <= 0 || shape.pp <= 0) {
    throw_error("mesh sizes must be at least 1, got dp={} tp={} pp={}", shape.dp, shape.tp,
                shape.pp);
  }
  if (shape.world_size() != world_size) {
    throw_error(
        "parallel.dp * parallel.tp * parallel.pp = {} * {} * {} = {} but there are {} "
        "workers: make the product equal the number of workers",
        shape.dp, shape.tp, shape.pp, shape.world_size(), world_size);
  }
}

int Mesh::size(MeshDim dim) const {
  switch (dim) {
    case MeshDim::kData:
      return shape_.dp;
    case MeshDim::kTensor:
      return shape_.tp;
    case MeshDim::kPipeline:
      return shape_.pp;
  }
  return 0;
}

MeshCoord Mesh::coord(int world_rank) const {
  if (world_rank < 0 || world_rank >= world_size()) {
    throw_error("world rank {} is outside the mesh {}", world_rank, describe());
  }
  MeshCoord c;
  c.tp_rank = world_rank % shape_.tp;
  c.dp_rank = (world_rank / shape_.tp) % shape_.dp;
  c.pp_stage = world_rank / (shape_.tp * shape_.dp);
  return c;
}

int Mesh::world_rank(const MeshCoord& c) const {
  BRIGADE_CHECK(c.dp_rank >= 0 && c.dp_rank < shape_.dp && c.tp_rank >= 0 &&
                c.tp_rank < shape_.tp && c.pp_stage >= 0 && c.pp_stage < shape_.pp);
  return (c.pp_stage * shape_.dp + c.dp_rank) * shape_.tp + c.tp_rank;
}

int Mesh::group_rank(MeshDim dim, int world_rank) const {
  const MeshCoord c = coord(world_rank);
  switch (dim) {
    case MeshDim::kData:
      return c.dp_rank;
    case MeshDim::kTensor:
      return c.tp_rank;
    case MeshDim::kPipeline:
      return c.pp_stage;
  }
  return 0;
}

std::vector<int> Mesh::group(MeshDim dim, int world_rank) const {
  MeshCoord c = coord(world_rank);
  std::vector<int> members;
  for (int i = 0; i < size(dim); ++i) {
    if (dim == MeshDim::kData) c.dp_rank = i;
    if (dim == MeshDim::kTensor) c.tp_rank = i;
    if (dim == MeshDim::kPipeline) c.pp_stage = i;
    members.push_back(this->world_rank(c));
  }
  return members;
}

std::vector<std::vector<int>> Mesh::groups(MeshDim dim) const {
  std::vector<std::vector<int>> all;
  for (int r = 0; r < world_size(); ++r) {
    if (group_rank(dim, r) == 0) all.push_back(group(dim, r));
  }
  return all;  // rank-0 members ascend with r, so groups come out ordered
}

bool Mesh::groups_within_node(MeshDim dim, int ranks_per_node) const {
  BRIGADE_CHECK(ranks_per_node > 0);
  for (const std::vector<int>& g : groups(dim)) {
    const auto [lo, hi] = std::minmax_element(g.begin(), g.end());
    if (*lo / ranks_per_node != *hi / ranks_per_node) return false;
  }
  return true;
}

std::string Mesh::describe() const {
  return fmt::format("dp={} x tp={} x pp={} ({} ranks)", shape_.dp, shape_.tp, shape_.pp,
                     world_size());
}

}  // namespace brigade
