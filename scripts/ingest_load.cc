// Load generator for scripts/bench_ingest.py: sends pre-serialized gRPC requests as fast as a
// fixed number of callers allow, so the generator itself costs the machine as little as possible.
//
// usage: ingest_load TARGET METHOD REQUEST_FILE CALLERS SECONDS LATENCY_FILE
//   REQUEST_FILE holds the requests as [uint32 little-endian length][message bytes] records.
//   Each caller has its own TCP connection and one call in flight. After connecting and one
//   warm-up call per caller the program prints "ready" and waits for a line on stdin; then it
//   runs for SECONDS and writes one float64 latency (seconds) per acknowledged call to
//   LATENCY_FILE and a JSON summary line to stdout.
// build: g++ -O2 -std=c++17 ingest_load.cc $(pkg-config --cflags --libs grpc++) -o ingest_load
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;

static std::vector<grpc::ByteBuffer> ReadRequests(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<grpc::ByteBuffer> out;
  size_t at = 0;
  while (at + 4 <= data.size()) {
    uint32_t size = 0;
    for (int i = 0; i < 4; ++i) size |= uint32_t(uint8_t(data[at + i])) << (8 * i);
    grpc::Slice slice(data.data() + at + 4, size);
    out.emplace_back(&slice, 1);
    at += 4 + size;
  }
  return out;
}

static double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// One unary call with a deadline; true if the server answered OK.
static bool Call(grpc::GenericStub& stub, grpc::CompletionQueue& cq, const std::string& method,
                 const grpc::ByteBuffer& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  call->Finish(&response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  return ok && status.ok();
}

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: ingest_load TARGET METHOD REQUEST_FILE CALLERS SECONDS LATENCY_FILE\n";
    return 2;
  }
  const std::string target = argv[1], method = argv[2];
  std::vector<grpc::ByteBuffer> requests = ReadRequests(argv[3]);
  const int callers = std::stoi(argv[4]);
  const double seconds = std::stod(argv[5]);
  if (requests.size() < size_t(2 * callers)) {
    std::cerr << "too few requests\n";
    return 2;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  std::vector<std::vector<double>> latencies(callers);
  std::vector<long> errors(callers, 0);
  std::atomic<int> warm{0};
  std::atomic<bool> go{false};
  Clock::time_point stop_at;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one TCP connection per caller
      args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 4 << 20);
      auto channel =
          grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
      grpc::GenericStub stub(channel);
      grpc::CompletionQueue cq;
      if (!Call(stub, cq, method, requests[next++])) errors[c]++;
      warm++;
      while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      auto& mine = latencies[c];
      while (true) {
        size_t i = next++;
        if (i >= requests.size() || Clock::now() >= stop_at) break;
        auto sent = Clock::now();
        if (Call(stub, cq, method, requests[i])) {
          mine.push_back(std::chrono::duration<double>(Clock::now() - sent).count());
        } else {
          errors[c]++;
        }
      }
      cq.Shutdown();
      void* tag;
      bool ok;
      while (cq.Next(&tag, &ok)) {
      }
    });
  }
  while (warm.load() < callers) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const size_t warm_calls = next.load();
  std::cout << "ready" << std::endl;
  std::string line;
  std::getline(std::cin, line);
  const double cpu_before = CpuSeconds();
  const auto began = Clock::now();
  stop_at = began + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(seconds));
  go = true;
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - began).count();
  const double cpu = CpuSeconds() - cpu_before;
  std::FILE* out = std::fopen(argv[6], "wb");
  long calls = 0, failed = 0;
  for (int c = 0; c < callers; ++c) {
    std::fwrite(latencies[c].data(), sizeof(double), latencies[c].size(), out);
    calls += long(latencies[c].size());
    failed += errors[c];
  }
  std::fclose(out);
  std::printf("{\"calls\": %ld, \"warm_calls\": %zu, \"errors\": %ld, \"seconds\": %.6f, "
              "\"cpu_seconds\": %.6f, \"exhausted\": %s}\n",
              calls, warm_calls, failed, elapsed, cpu,
              next.load() >= requests.size() ? "true" : "false");
  return 0;
}
