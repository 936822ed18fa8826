/* mpi_allreduce_peer: OpenMPI's MPI_Allreduce (f32 sum), or its send/recv,
 * timed the way `brigade bench comm` times its own, so bench/compare_comm.py
 * can put the two side by side. A benchmark peer only: brigade never links MPI.
 *
 *   mpirun -np 2 mpi_allreduce_peer [--op all_reduce|send_recv]
 *                                   [--min-bytes 4096] [--max-bytes 268435456] [--json]
 *
 * send_recv is brigade's: every rank sends the buffer to the next rank and
 * receives as much from the previous one at once (MPI_Isend, MPI_Irecv,
 * MPI_Waitall); its time is one such exchange, busbw = algbw.
 *
 * For each size (powers of 4): check one all-reduce of rank-dependent values
 * element by element, warm up, calibrate an iteration count for about 0.2 s
 * (agreed by every rank through MPI_MAX), time it, and report the slowest
 * rank's time per operation, algbw = bytes / time and busbw = algbw * 2(n-1)/n
 * (nccl-tests' definitions), in the same columns and JSON keys as brigade. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double kTargetSeconds = 0.2;
static const double kCalibrationSeconds = 0.02;
static const int64_t kMaxIters = 1000000;
static const int kWarmupIters = 2;

static double max_over_ranks(double value) {
  double result = 0;
  MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return result;
}

static int g_send_recv = 0;  /* --op send_recv */
static float* g_received = NULL;

static void exchange(float* data, int64_t count) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Request requests[2];
  MPI_Irecv(g_received, (int)count, MPI_FLOAT, (rank + size - 1) % size, 0, MPI_COMM_WORLD,
            &requests[0]);
  MPI_Isend(data, (int)count, MPI_FLOAT, (rank + 1) % size, 0, MPI_COMM_WORLD, &requests[1]);
  MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
}

/* Seconds per operation on this rank, `iters` back to back after a barrier. */
static double time_allreduce(float* data, int64_t count, int64_t iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int64_t i = 0; i < iters; ++i) {
    if (g_send_recv) {
      exchange(data, count);
    } else {
      MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
  }
  return (MPI_Wtime() - start) / (double)iters;
}

static int64_t clamp_iters(double value, int64_t max_iters) {
  if (!(value >= 1)) return 1;
  if (value > (double)max_iters) return max_iters;
  return (int64_t)value;
}

/* Small integers, so every sum is exact in f32. */
static float pattern(int64_t i) {
  return (float)(i % 7 + 1);
}

static void check_allreduce(float* data, int64_t count, int rank, int size) {
  for (int64_t i = 0; i < count; ++i) data[i] = (float)(rank + 1) * pattern(i);
  if (g_send_recv) {
    exchange(data, count);
    const int prev = (rank + size - 1) % size;
    for (int64_t i = 0; i < count; ++i) {
      if (g_received[i] != (float)(prev + 1) * pattern(i)) {
        fprintf(stderr, "mpi_allreduce_peer: rank %d: element %lld received is %g, expected %g\n",
                rank, (long long)i, g_received[i], (float)(prev + 1) * pattern(i));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    return;
  }
  MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const float triangle = (float)(size * (size + 1) / 2);
  for (int64_t i = 0; i < count; ++i) {
    if (data[i] != triangle * pattern(i)) {
      fprintf(stderr, "mpi_allreduce_peer: rank %d: element %lld of %lld is %g, expected %g\n",
              rank, (long long)i, (long long)count, data[i], triangle * pattern(i));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
}

static void format_bytes(int64_t bytes, char* out, size_t out_size) {
  if (bytes >= (1 << 30) && bytes % (1 << 30) == 0) {
    snprintf(out, out_size, "%lldG", (long long)(bytes >> 30));
  } else if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) {
    snprintf(out, out_size, "%lldM", (long long)(bytes >> 20));
  } else if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) {
    snprintf(out, out_size, "%lldK", (long long)(bytes >> 10));
  } else {
    snprintf(out, out_size, "%lld", (long long)bytes);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 256 << 20;
  int json = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--min-bytes") == 0 && i + 1 < argc) {
      min_bytes = strtoll(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--max-bytes") == 0 && i + 1 < argc) {
      max_bytes = strtoll(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc &&
               (strcmp(argv[i + 1], "all_reduce") == 0 || strcmp(argv[i + 1], "send_recv") == 0)) {
      g_send_recv = strcmp(argv[++i], "send_recv") == 0;
    } else {
      if (rank == 0) {
        fprintf(stderr,
                "usage: %s [--op all_reduce|send_recv] [--min-bytes BYTES] [--max-bytes BYTES] "
                "[--json]\n",
                argv[0]);
      }
      MPI_Finalize();
      return 2;
    }
  }
  if (min_bytes < 4 || max_bytes < min_bytes || max_bytes / 4 > 2147483647) {
    if (rank == 0) fprintf(stderr, "mpi_allreduce_peer: need 4 <= min-bytes <= max-bytes < 8G\n");
    MPI_Finalize();
    return 2;
  }

  float* data = malloc((size_t)max_bytes);
  g_received = malloc((size_t)max_bytes);
  if (data == NULL || g_received == NULL) {
    fprintf(stderr, "mpi_allreduce_peer: cannot allocate %lld bytes\n", (long long)max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0 && !json) {
    printf("mpi_allreduce_peer: %s, %d processes, f32\n",
           g_send_recv ? "MPI_Isend/MPI_Irecv to the next/from the previous rank" : "MPI_Allreduce sum",
           size);
    printf("%10s  %-15s %8s %12s %12s %12s\n", "size", "op", "iters", "time us", "algbw GB/s",
           "busbw GB/s");
  }
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const int64_t count = bytes / 4;
    check_allreduce(data, count, rank, size);
    /* Zeros from here on: repeated sums of them stay finite and normal. */
    memset(data, 0, (size_t)(count * 4));
    for (int i = 0; i < kWarmupIters; ++i) time_allreduce(data, count, 1);
    const double first_s = max_over_ranks(time_allreduce(data, count, 1));
    const int64_t calibration_iters = clamp_iters(kCalibrationSeconds / first_s, 1000);
    const double calibrated_s = max_over_ranks(time_allreduce(data, count, calibration_iters));
    const int64_t iters = clamp_iters(kTargetSeconds / calibrated_s, kMaxIters);
    const double time_s = max_over_ranks(time_allreduce(data, count, iters));

    const int64_t reported_bytes = count * 4;
    const double algbw_gbps = (double)reported_bytes / time_s / 1e9;
    const double busbw_gbps = g_send_recv ? algbw_gbps : algbw_gbps * 2.0 * (size - 1) / size;
    const char* op = g_send_recv ? "send_recv" : "all_reduce";
    if (rank != 0) continue;
    if (json) {
      printf(
          "{\"backend\":\"mpi\",\"nproc\":%d,\"op\":\"%s\",\"dtype\":\"f32\","
          "\"bytes\":%lld,\"iters\":%lld,\"time_us\":%.3f,\"algbw_gbps\":%.6f,"
          "\"busbw_gbps\":%.6f}\n",
          size, op, (long long)reported_bytes, (long long)iters, time_s * 1e6, algbw_gbps, busbw_gbps);
    } else {
      char label[32];
      format_bytes(reported_bytes, label, sizeof(label));
      printf("%10s  %-15s %8lld %12.2f %12.3f %12.3f\n", label, op, (long long)iters,
             time_s * 1e6, algbw_gbps, busbw_gbps);
    }
    fflush(stdout);
  }
  free(data);
  free(g_received);
  MPI_Finalize();
  return 0;
}
