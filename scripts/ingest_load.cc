// Load generator for scripts/bench_ingest.py: sends pre-serialized gRPC requests as fast as a
// fixed number of callers allow, so the generator itself costs the machine as little as possible.
//
// usage: ingest_load TARGET METHOD REQUEST_FILE CALLERS SECONDS LATENCY_FILE
//   REQUEST_FILE holds the requests as [uint32 little-endian length][message bytes] records.
//   Each caller has its own TCP connection and one call in flight; one thread drives them all
//   through one completion queue (cheaper than a thread per caller). After connecting and one
//   warm-up call per caller the program prints "ready" and waits for a line on stdin; then it
//   runs for SECONDS and writes one float64 latency (seconds) per acknowledged call to
//   LATENCY_FILE and a JSON summary line to stdout.
// build: g++ -O2 -std=c++17 ingest_load.cc $(pkg-config --cflags --libs grpc++) -o ingest_load
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
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

// One caller: its own channel (TCP connection) and at most one call in flight.
struct Caller {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call;
  grpc::ByteBuffer response;
  grpc::Status status;
  Clock::time_point sent;
};

static void Start(Caller& caller, size_t index, grpc::CompletionQueue& cq,
                  const std::string& method, const grpc::ByteBuffer& request) {
  caller.context = std::make_unique<grpc::ClientContext>();
  caller.context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  caller.sent = Clock::now();
  caller.call = caller.stub->PrepareUnaryCall(caller.context.get(), method, request, &cq);
  caller.call->StartCall();
  caller.call->Finish(&caller.response, &caller.status, reinterpret_cast<void*>(index));
}

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: ingest_load TARGET METHOD REQUEST_FILE CALLERS SECONDS LATENCY_FILE\n";
    return 2;
  }
  const std::string target = argv[1], method = argv[2];
  std::vector<grpc::ByteBuffer> requests = ReadRequests(argv[3]);
  const size_t callers = std::stoul(argv[4]);
  const double seconds = std::stod(argv[5]);
  if (requests.size() < 2 * callers) {
    std::cerr << "too few requests\n";
    return 2;
  }
  // All callers share one completion queue driven by this one thread: no thread switches.
  grpc::CompletionQueue cq;
  std::vector<Caller> pool(callers);
  size_t next = 0;
  for (size_t c = 0; c < callers; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one TCP connection per caller
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 4 << 20);
    pool[c].channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    pool[c].stub = std::make_unique<grpc::GenericStub>(pool[c].channel);
    Start(pool[c], c, cq, method, requests[next++]);  // warm-up call: connects
  }
  long errors = 0;
  void* tag = nullptr;
  bool ok = false;
  for (size_t done = 0; done < callers; ++done) {
    cq.Next(&tag, &ok);
    if (!ok || !pool[reinterpret_cast<size_t>(tag)].status.ok()) errors++;
  }
  const size_t warm_calls = next;
  std::cout << "ready" << std::endl;
  std::string line;
  std::getline(std::cin, line);
  const double cpu_before = CpuSeconds();
  const auto began = Clock::now();
  const auto stop_at = began + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(seconds));
  std::vector<double> latencies;
  size_t active = 0;
  for (size_t c = 0; c < callers && next < requests.size(); ++c, ++active) {
    Start(pool[c], c, cq, method, requests[next++]);
  }
  while (active > 0 && cq.Next(&tag, &ok)) {
    const size_t c = reinterpret_cast<size_t>(tag);
    const auto now = Clock::now();
    if (ok && pool[c].status.ok()) {
      latencies.push_back(std::chrono::duration<double>(now - pool[c].sent).count());
    } else {
      errors++;
    }
    if (now < stop_at && next < requests.size()) {
      Start(pool[c], c, cq, method, requests[next++]);
    } else {
      active--;
    }
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - began).count();
  const double cpu = CpuSeconds() - cpu_before;
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  std::FILE* out = std::fopen(argv[6], "wb");
  std::fwrite(latencies.data(), sizeof(double), latencies.size(), out);
  std::fclose(out);
  std::printf("{\"calls\": %zu, \"warm_calls\": %zu, \"errors\": %ld, \"seconds\": %.6f, "
              "\"cpu_seconds\": %.6f, \"exhausted\": %s}\n",
              latencies.size(), warm_calls, errors, elapsed, cpu,
              next >= requests.size() ? "true" : "false");
  return 0;
}
