#include "brigade/parallel/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "brigade/core/config.h"
#include "brigade/core/error.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

TEST(Mesh, TensorRanksAreAdjacentThenDataThenPipeline) {
  const Mesh mesh({/*dp=*/2, /*tp=*/4, /*pp=*/2}, 16);
  EXPECT_EQ(mesh.group(MeshDim::kTensor, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(mesh.group(MeshDim::kData, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(mesh.group(MeshDim::kPipeline, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(mesh.coord(13), (MeshCoord{/*dp_rank=*/1, /*tp_rank=*/1, /*pp_stage=*/1}));
  EXPECT_EQ(mesh.group_rank(MeshDim::kTensor, 6), 2);
}

TEST(Mesh, CoordinatesRoundTripForEveryShapeOf24) {
  for (int dp : {1, 2, 3, 4, 6, 12, 24}) {
    for (int tp : {1, 2, 4, 8}) {
      if (24 % (dp * tp) != 0) continue;
      const int pp = 24 / (dp * tp);
      const Mesh mesh({dp, tp, pp}, 24);
      for (int r = 0; r < 24; ++r) ASSERT_EQ(mesh.world_rank(mesh.coord(r)), r);
    }
  }
}

TEST(Mesh, GroupsPartitionTheWorldAlongEachDimension) {
  const Mesh mesh({3, 2, 2}, 12);
  for (MeshDim dim : {MeshDim::kData, MeshDim::kTensor, MeshDim::kPipeline}) {
    std::multiset<int> seen;
    const auto groups = mesh.groups(dim);
    EXPECT_EQ(static_cast<int>(groups.size()), 12 / mesh.size(dim)) << mesh_dim_name(dim);
    for (const auto& g : groups) {
      EXPECT_EQ(static_cast<int>(g.size()), mesh.size(dim));
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_EQ(mesh.group_rank(dim, g[i]), static_cast<int>(i));
        EXPECT_EQ(mesh.group(dim, g[i]), g);  // every member sees the same group
      }
      seen.insert(g.begin(), g.end());
    }
    for (int r = 0; r < 12; ++r) EXPECT_EQ(seen.count(r), 1u) << mesh_dim_name(dim);
  }
}

TEST(Mesh, TensorGroupsStayOnANode) {
  const Mesh mesh({4, 8, 2}, 64);
  EXPECT_TRUE(mesh.groups_within_node(MeshDim::kTensor, 8));
  EXPECT_FALSE(mesh.groups_within_node(MeshDim::kData, 8));
  EXPECT_FALSE(mesh.groups_within_node(MeshDim::kTensor, 4));  // tp 8 cannot fit 4 per node
}

TEST(Mesh, SizeMismatchNamesBothNumbers) {
  try {
    Mesh({2, 2, 2}, 6);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("= 8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("6 workers"), std::string::npos) << msg;
  }
  EXPECT_THROW(Mesh({0, 1, 1}, 0), Error);
}

TEST(MeshShape, ReadsTheParallelSection) {
  Config c = Config::from_string("[parallel]\ndp = 4\ntp = 2\n");
  const MeshShape s = MeshShape::from_config(c);
  EXPECT_EQ(s.dp, 4);
  EXPECT_EQ(s.tp, 2);
  EXPECT_EQ(s.pp, 1);
  Config bad = Config::from_string("[parallel]\npp = 0\n");
  EXPECT_THROW(MeshShape::from_config(bad), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
