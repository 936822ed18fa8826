// The device mesh: how world ranks map to data-, tensor- and pipeline-parallel
// coordinates, and which ranks form each group. The single source of truth
// for "who talks to whom"; nothing else computes rank arithmetic.
//
// Layout (Megatron's order): tensor-parallel ranks are adjacent, then data
// parallel, then pipeline stages outermost:
//   world_rank = (pp_stage * dp_size + dp_rank) * tp_size + tp_rank
// Adjacent ranks share a node when workers are started node by node (as
// `brigade launch` does), so the tp group, which all-reduces twice per
// block, stays on the fastest links; pipeline stages, which only pass
// activations between neighbours, span nodes.
#pragma once

#include <string>
#include <vector>

namespace brigade {

class Config;

enum class MeshDim { kData, kTensor, kPipeline };

const char* mesh_dim_name(MeshDim dim);  // "dp", "tp", "pp"

struct MeshShape {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int world_size() const { return dp * tp * pp; }
  // Reads [parallel] dp, tp, pp (each default 1).
  static MeshShape from_config(Config& config);
};

struct MeshCoord {
  int dp_rank = 0;
  int tp_rank = 0;
  int pp_stage = 0;
  bool operator==(const MeshCoord&) const = default;
};

class Mesh {
 public:
  // Error if shape.world_size() != world_size, naming both and the fix.
  Mesh(MeshShape shape, int world_size);

  const MeshShape& shape() const { return shape_; }
  int world_size() const { return shape_.world_size(); }
  int size(MeshDim dim) const;

  MeshCoord coord(int world_rank) const;
  int world_rank(const MeshCoord& coord) const;
  // This rank's index within its group along `dim` (its dp_rank, tp_rank or pp_stage).
  int group_rank(MeshDim dim, int world_rank) const;

  // The world ranks of the group along `dim` that contains world_rank, in
  // group-rank order: group(kTensor, r)[i] has tp_rank i.
  std::vector<int> group(MeshDim dim, int world_rank) const;
  // Every group along `dim`, each in group-rank order, ordered by their
  // smallest member: together they partition the world exactly once.
  std::vector<std::vector<int>> groups(MeshDim dim) const;

  // Whether every group along `dim` lies within one node, when nodes hold
  // `ranks_per_node` consecutive world ranks.
  bool groups_within_node(MeshDim dim, int ranks_per_node) const;

  std::string describe() const;  // "dp=2 x tp=4 x pp=2 (16 ranks)"

 private:
  MeshShape shape_;
};

}  // namespace brigade
