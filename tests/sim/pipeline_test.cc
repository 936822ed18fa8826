// The planner's pipeline: its bubble and memory are the simulated schedule's,
// the shortcut for many micro-batches agrees with the full simulation, and
// the search picks the schedule as part of the layout.
#include "brigade/sim/pipeline.h"

#include <gtest/gtest.h>

#include "brigade/core/error.h"
#include "brigade/sim/cost_model.h"
#include "brigade/sim/model_presets.h"
#include "brigade/sim/search.h"
#include "brigade/sim/transformer_formulas.h"
#include "brigade/sim/validation.h"

namespace brigade::sim {
namespace BRIGADE_TEST_FILE {

using schedule::Kind;

// Uneven stages, as the planner's are: the first holds the embedding, the
// last the LM head, and the backward's two parts differ.
PipelineCosts uneven() {
  return PipelineCosts{{1.1, 1.3, 0.9}, {1.0, 1.2, 0.8}, {1.6, 2.1, 1.0}};
}

schedule::Simulation full(const schedule::Shape& shape, const PipelineCosts& c) {
  schedule::Costs costs;
  costs.stages.clear();
  for (int64_t s = 0; s < shape.stages; ++s) {
    costs.stages.push_back(s == 0 ? c.first : s == shape.stages - 1 ? c.last : c.middle);
  }
  return schedule::simulate(schedule::all_stage_instructions(shape), costs, false);
}

TEST(Pipeline, ManyMicroBatchesExtendTheSteadyStateExactly) {
  const PipelineCosts c = uneven();
  for (Kind kind : {Kind::kGpipe, Kind::kOneFOneB, Kind::kInterleaved, Kind::kZbH1}) {
    for (int64_t p : {1, 2, 3, 4, 8, 16}) {
      for (int64_t v : {1, 2, 3, 4}) {
        for (int64_t m = p; m <= 12 * p + 3; m += (kind == Kind::kInterleaved ? p : 1)) {
          const schedule::Shape shape{kind, p, m, v};
          try {
            schedule::check(shape);
          } catch (const Error&) {
            continue;
          }
          const schedule::Simulation sim = full(shape, c);
          ASSERT_TRUE(sim.ok) << sim.problem;
          const PipelineResult r = simulate_pipeline(shape, c);
          const std::string what =
              fmt::format("{} p={} m={} v={}", schedule::kind_name(kind), p, m, v);
          EXPECT_NEAR(r.step_s, sim.step_s, 1e-9 * sim.step_s) << what;
          EXPECT_NEAR(r.live_first, sim.stages.front().peak_live_microbatches, 1e-9) << what;
          EXPECT_NEAR(r.live_last, sim.stages.back().peak_live_microbatches, 1e-9) << what;
        }
      }
    }
  }
}

TEST(Pipeline, EqualStagesGiveMegatronsClosedForms) {
  const PipelineCosts c{{1.0, 1.5, 0.5}, {1.0, 1.5, 0.5}, {1.0, 1.5, 0.5}};
  for (int64_t p : {2, 4, 8}) {
    for (int64_t v : {1, 2, 4}) {
      for (int64_t m = p; m <= 16 * p; m += p) {
        const schedule::Shape shape{v > 1 ? Kind::kInterleaved : Kind::kOneFOneB, p, m, v};
        const PipelineResult r = simulate_pipeline(shape, c);
        const double work = 3.0 * static_cast<double>(m);
        EXPECT_NEAR((r.step_s - work) / r.step_s, bubble_fraction(p, v, m), 1e-12)
            << "p=" << p << " m=" << m << " v=" << v;
        Layout l;
        l.pp = p;
        l.vp = v;
        EXPECT_NEAR(r.live_first, inflight_microbatches(l, m), 1e-12)
            << "p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

TEST(Pipeline, RepeatedShapesAreSimulatedOnce) {
  const PipelineCosts c = uneven();
  const schedule::Shape shape{Kind::kZbH1, 7, 19, 1};  // no other test uses p = 7
  const int64_t before = pipeline_simulations_run();
  const PipelineResult a = simulate_pipeline(shape, c);
  const int64_t after_first = pipeline_simulations_run();
  EXPECT_GT(after_first, before);
  // The same shape with every cost doubled (a device half as fast): the same
  // simulation, twice the time.
  PipelineCosts slow = c;
  for (schedule::StageCosts* s : {&slow.first, &slow.middle, &slow.last}) {
    s->forward *= 2, s->backward_input *= 2, s->backward_weight *= 2;
  }
  const PipelineResult b = simulate_pipeline(shape, slow);
  EXPECT_EQ(pipeline_simulations_run(), after_first);
  EXPECT_NEAR(b.step_s, 2.0 * a.step_s, 1e-12 * a.step_s);
  EXPECT_EQ(b.live_first, a.live_first);
  // Different ratios are a different simulation.
  slow.last.backward_weight *= 1.5;
  simulate_pipeline(shape, slow);
  EXPECT_GT(pipeline_simulations_run(), after_first);
}

Workload gpt3() {
  Workload job = preset_workload("175b");
  job.global_batch = 64;
  return job;
}

// The same job with Megatron-LM's LM head: its backward in the backward pass.
Workload with_megatron_head(Workload job) {
  job.features.head_backward_in_forward = false;
  return job;
}

Layout with(Kind kind, int64_t vp = 1) {
  Layout l = Layout::parse("tp=8,pp=8,dp=1,micro=1");
  l.schedule = kind;
  l.vp = vp;
  return l;
}

TEST(Pipeline, EstimateTakesBubbleAndMemoryFromTheSchedule) {
  const Hardware& hw = hardware_by_name("h100-80g");
  const Workload job = gpt3();
  const Estimate gpipe = estimate(job, with(Kind::kGpipe), hw);
  const Estimate ofob = estimate(job, with(Kind::kOneFOneB), hw);
  const Estimate il = estimate(job, with(Kind::kInterleaved, 2), hw);
  const Estimate zb = estimate(job, with(Kind::kZbH1), hw);
  for (const Estimate* e : {&gpipe, &ofob, &il, &zb}) ASSERT_TRUE(e->valid) << e->invalid;
  // GPipe and 1F1B idle the same; interleaving and ZB-H1 idle less.
  EXPECT_NEAR(gpipe.time.bubble_s, ofob.time.bubble_s, 1e-9 * ofob.time.bubble_s);
  EXPECT_LT(il.time.bubble_s, 0.6 * ofob.time.bubble_s);
  EXPECT_LT(zb.time.bubble_s, 0.7 * ofob.time.bubble_s);
  EXPECT_EQ(zb.time.compute_s, ofob.time.compute_s);
  // The bubble is the simulated step less the slowest stage's work: with
  // nearly equal stages, 1F1B's is close to (p-1) stage-times.
  const double per_microbatch = (ofob.time.compute_s + ofob.time.tp_comm_s) / 64.0;
  EXPECT_GT(ofob.time.bubble_s, 6.0 * per_microbatch);
  EXPECT_LT(ofob.time.bubble_s, 7.0 * per_microbatch);
  // GPipe keeps all 64 micro-batches' activations; 1F1B and ZB-H1 keep p = 8
  // on the first stage, ZB-H1's each with its 12 blocks' output gradients
  // from B to W besides.
  EXPECT_NEAR(gpipe.memory.activations / ofob.memory.activations, 8.0, 0.01);
  const double kept =
      8 * 12 * split_backward_kept_bytes(job.model, job.seq_len, zb.layout, job.features);
  EXPECT_NEAR(zb.memory.activations, ofob.memory.activations + kept, 1e-9 * kept);
}

// The planner simulates the passes as the executor runs them: the LM head's
// loss and input gradients inside the last stage's forward (one chunked
// kernel with the loss), its weight gradient in W with the blocks' (ZB-H1
// defers it). Megatron-LM runs the head's backward in its backward pass.
TEST(Pipeline, LastStagesWeightPassCarriesTheLmHeadsWeightGradient) {
  const Hardware& hw = hardware_by_name("h100-80g");
  const Workload job = gpt3();
  const Workload megatron = with_megatron_head(job);
  const Estimate e = estimate(job, with(Kind::kZbH1), hw);
  const Estimate m = estimate(megatron, with(Kind::kZbH1), hw);
  ASSERT_TRUE(e.valid && m.valid) << e.invalid << m.invalid;
  const schedule::StageCosts &last = e.last_stage, &middle = e.middle_stage;
  // 12 blocks on each stage: what the last has more is the head's. Its
  // weight-gradient GEMM (12288 x V/8 x 2048) is the W's excess...
  const double head_dw = last.backward_weight - middle.backward_weight;
  EXPECT_GT(head_dw, 0.01 * middle.backward_weight);
  EXPECT_EQ(m.last_stage.backward_weight, last.backward_weight);
  // ...and the same GEMM's size forward, and again for the input gradient,
  // are in the forward, with the loss's backward, moved there from B (which
  // keeps ln_f's backward and the tp sum of the head's input gradient).
  const double head_in_fwd = last.forward - m.last_stage.forward;
  EXPECT_GT(head_in_fwd, 0.9 * head_dw);
  EXPECT_LT(last.forward - middle.forward, 3.0 * head_dw);
  EXPECT_GT(last.forward - middle.forward, 2.0 * head_dw);
  EXPECT_NEAR(m.last_stage.backward_input - last.backward_input, head_in_fwd, 1e-12);
  // The other stages are as they were.
  EXPECT_EQ(e.middle_stage.forward, m.middle_stage.forward);
  EXPECT_EQ(e.first_stage.forward, m.first_stage.forward);
  // 1F1B's backward is whole, so the head's weight gradient stays in the
  // forward with the rest of its backward: the last stage's W is the blocks'.
  const Estimate o = estimate(job, with(Kind::kOneFOneB), hw);
  ASSERT_TRUE(o.valid) << o.invalid;
  EXPECT_EQ(o.last_stage.backward_weight, o.middle_stage.backward_weight);
  EXPECT_NEAR(o.last_stage.forward - last.forward, head_dw, 1e-9 * head_dw);
  EXPECT_NEAR(o.last_stage.backward_input, last.backward_input, 1e-9 * last.backward_input);
}

// Deferring the head's weight gradient keeps each micro-batch's dlogits
// (N x V/tp fp32) on the last stage until its W: with the micro-batches the
// schedule holds there, on top of what Megatron-style ZB-H1 or 1F1B keep.
TEST(Pipeline, ZbH1LastStageMemoryCountsTheKeptDlogits) {
  const Hardware& hw = hardware_by_name("h100-80g");
  const Workload job = gpt3();
  const Workload megatron = with_megatron_head(job);
  const Estimate zb = estimate(job, with(Kind::kZbH1), hw);
  const Estimate zb_megatron = estimate(megatron, with(Kind::kZbH1), hw);
  const Estimate ofob = estimate(job, with(Kind::kOneFOneB), hw);
  const Estimate ofob_megatron = estimate(megatron, with(Kind::kOneFOneB), hw);
  for (const Estimate* e : {&zb, &zb_megatron, &ofob, &ofob_megatron}) {
    ASSERT_TRUE(e->valid) << e->invalid;
  }
  const double live =
      simulate_pipeline(schedule::Shape{Kind::kZbH1, 8, zb.num_microbatches, 1},
                        PipelineCosts{zb.first_stage, zb.middle_stage, zb.last_stage})
          .live_last;
  ASSERT_EQ(live, 8.0) << "min(pp, micro-batches)";
  // fp32, micro 1 x seq 2048 rows, the (padded) vocabulary over tp 8.
  const double dlogits = 4.0 * 2048 * static_cast<double>(job.model.vocab_size) / 8;
  EXPECT_NEAR(zb.last_stage_memory.activations - zb_megatron.last_stage_memory.activations,
              live * dlogits, 1e-6 * dlogits);
  // 1F1B keeps none: its head's backward is whole inside the forward.
  EXPECT_EQ(ofob.last_stage_memory.activations, ofob_megatron.last_stage_memory.activations);
  EXPECT_GT(zb.last_stage_memory.activations, ofob.last_stage_memory.activations + live * dlogits);
}

// ZB-H1's W reads each linear layer's output gradient, so every micro-batch
// a stage holds keeps its blocks' output gradients from B to W, on top of
// its activations: s b (2h + 7h/t) per block (Megatron's head here, so no
// dlogits). The last stage holds min(p, m) micro-batches.
TEST(Pipeline, ZbH1MemoryCountsEachBlocksKeptOutputGradients) {
  const Hardware& hw = hardware_by_name("h100-80g");
  const Workload job = with_megatron_head(gpt3());
  const Estimate zb = estimate(job, with(Kind::kZbH1), hw);
  ASSERT_TRUE(zb.valid) << zb.invalid;
  const Layout& l = zb.layout;
  const double h = static_cast<double>(job.model.n_embd), t = static_cast<double>(l.tp);
  const double rows = static_cast<double>(l.micro * job.seq_len);
  const double kept = split_backward_kept_bytes(job.model, job.seq_len, l, job.features);
  EXPECT_DOUBLE_EQ(kept, job.features.act_bytes * rows * (2 * h + 7 * h / t));
  const double live =
      simulate_pipeline(schedule::Shape{Kind::kZbH1, 8, zb.num_microbatches, 1},
                        PipelineCosts{zb.first_stage, zb.middle_stage, zb.last_stage})
          .live_last;
  const double layers = static_cast<double>(job.model.n_layer / l.pp);
  const double block = block_activation_bytes(job.model, job.seq_len, l, job.features);
  const double logits =
      4.0 * rows * static_cast<double>(job.model.vocab_size) / t + 4.0 * rows * h / t;
  const double want = layers * (block + kept) * live + logits;
  EXPECT_NEAR(zb.last_stage_memory.activations, want, 1e-9 * want);
}

TEST(Pipeline, ScheduleIsPartOfTheLayout) {
  const Hardware& hw = hardware_by_name("h100-80g");
  LayoutPins pins;
  pins.tp = 8;
  pins.pp = 8;
  pins.vp = 1;
  pins.micro = 1;
  pins.recompute = PlanRecompute::kNone;
  const SearchResult r = search_layouts(gpt3(), 64, hw, pins, 10);
  ASSERT_FALSE(r.ranked.empty());
  // With one chunk per stage the search tries GPipe, 1F1B and ZB-H1, and
  // ZB-H1 idles least.
  EXPECT_EQ(r.ranked.front().layout.schedule, Kind::kZbH1);
  EXPECT_NE(r.ranked.front().layout.to_string().find("schedule=zb-h1"), std::string::npos);
  // Software without ZB-H1 (Megatron-LM 2021) falls back to 1F1B.
  Workload megatron = gpt3();
  megatron.features.schedules = SystemFeatures::megatron_2021().schedules;
  const SearchResult m = search_layouts(megatron, 64, hw, pins, 10);
  ASSERT_FALSE(m.ranked.empty());
  EXPECT_EQ(m.ranked.front().layout.schedule, Kind::kOneFOneB);
  EXPECT_NE(estimate(megatron, with(Kind::kZbH1), hw).invalid.find("does not run the zb-h1"),
            std::string::npos);
  // A pinned schedule is the only one searched.
  pins.schedule = Kind::kGpipe;
  for (const Estimate& e : search_layouts(gpt3(), 64, hw, pins, 10).ranked) {
    EXPECT_EQ(e.layout.schedule, Kind::kGpipe);
  }
}

TEST(Pipeline, ValidationModelsTheSchedulesTheMeasuredRunsUsed) {
  // Every published row ran Megatron-LM: 1F1B, interleaved with vp > 1.
  const ValidationSummary v = validate(parse_published_runs(builtin_published_csv()));
  int64_t pipelined = 0;
  for (const ValidationRow& row : v.rows) {
    ASSERT_TRUE(row.predicted_ok) << row.run.name;
    const Kind kind = row.layout.pipeline_schedule();
    EXPECT_EQ(kind, row.layout.vp > 1 ? Kind::kInterleaved : Kind::kOneFOneB) << row.run.name;
    if (row.layout.pp > 1) ++pipelined;
  }
  EXPECT_GT(pipelined, 10);
}

TEST(Pipeline, LayoutsNameTheirSchedule) {
  EXPECT_EQ(Layout::parse("pp=4,vp=2").schedule, Kind::kInterleaved);
  EXPECT_EQ(Layout::parse("pp=4").schedule, Kind::kOneFOneB);
  EXPECT_EQ(Layout::parse("pp=4,schedule=zb-h1").schedule, Kind::kZbH1);
  try {
    Layout::parse("pp=4,schedule=zb");
    ADD_FAILURE() << "accepted schedule=zb";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: gpipe, 1f1b, interleaved, zb-h1"),
              std::string::npos);
  }
  const Hardware& hw = hardware_by_name("h100-80g");
  Layout l = with(Kind::kZbH1, 2);
  EXPECT_NE(estimate(gpt3(), l, hw).invalid.find("zb-h1 schedule has no virtual stages"),
            std::string::npos);
  l = with(Kind::kInterleaved, 1);
  EXPECT_NE(estimate(gpt3(), l, hw).invalid.find("needs vp >= 2"), std::string::npos);
  // As brigade train refuses it: W needs every block's activations.
  l = with(Kind::kZbH1);
  l.recompute = PlanRecompute::kFull;
  EXPECT_NE(estimate(gpt3(), l, hw).invalid.find("full recompute keeps one block's"),
            std::string::npos);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::sim
