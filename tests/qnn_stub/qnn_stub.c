/* SPDX-License-Identifier: Apache-2.0 */
/* its hand layout: clang-format 14 folds statement macros (DECL(0) DECL(1) ..., X-lists) into one
 * line with the code after them */
/* clang-format off */
/* A stand-in for libQnnHtp.so and libQnnSystem.so (one source, built as both), for testing the qnn
 * backend without the SDK or a device.
 *
 * Its binary interface is declared here, independently of src/backend/qnn/qnn_abi.h, from the
 * layouts the public QAIRT headers give (SDK 2.22, 2.25, 2.36, 2.40, 2.43; measured with offsetof
 * against each SDK, LP64). The numbers behind every declaration are in the research notes of the
 * issue (QnnSystemContext binary/graph info versions, interface tables, error codes, tensors,
 * memory descriptors, HTP perf infrastructure); _Static_asserts below pin them.
 *
 * It impersonates one SDK at a time: MA_QNN_STUB_API=MAJOR.MINOR is the core API it reports
 * (default 2.32, QAIRT 2.43), and with it come that SDK's system API version, the length of its
 * interface tables, the versions of binary info and graph info it can return and the size of
 * QnnSystemContext_GraphInfo_t (the stride of the graphs array): 48 bytes up to API 2.16, 64 for
 * API 2.17 - 2.20, 88 from API 2.21 (QAIRT 2.28) on.
 *
 * Its "context binaries" are files tests/qnn_stub/make_contexts.py writes:
 *
 *   MA-QNN-STUB 1\n{"graph": NAME, "session": SESSION, "model": CONTEXT_DIR, "inputs": [T...], "outputs": [T...]}
 *   MA-QNN-STUB 1\n{"model": CONTEXT_DIR, "soc_model": N, "graphs": [{"graph", "session", "inputs", "outputs"}...]}
 *
 *   T = {"name", "dims", "dtype", ["encoding", "scale", "offset", "bitwidth", "axis", "scales",
 *        "offsets", "block_size", "blocks_per_axis", "block_scale_bitwidth"]}
 *
 * A context may hold several graphs (graphRetrieve finds them by name; a missing one is
 * QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST, 6002); "soc_model" is reported in binary info v3.
 * Errors are the SDK's numbers, and errorGetMessage names them ("QNN_..._ERROR_...: detail").
 * logCreate calls the client's callback once, as the HTP library greets (a format and a va_list).
 * memRegister takes ION descriptors (and HTP custom shared-buffer ones) whose fd comes from the
 * stand-in rpcmem (tests/qnn_stub/cdsprpc_stub.c), maps it, and graphExecute reads and writes tensors
 * given as QNN_TENSORMEMTYPE_MEMHANDLE there. deviceGetInfrastructure gives the HTP perf
 * infrastructure: createPowerConfigId / setPowerConfig / destroyPowerConfigId / setMemoryConfig check
 * their arguments (a live id, DCVS v3 contextId = the id, sleep latency 10-65535 us, voltage corners
 * min <= target <= max, RPC polling <= 9999 us; setPowerConfig after destroy is refused) and log each
 * call and each config to MA_QNN_STUB_LOG.
 *
 * A graph runs the named molmoact session with the cpu kernels on the GGUF contexts of CONTEXT_DIR,
 * converting its tensors from and to the declared types (float32, float16, ufixed16, ufixed8,
 * sfixed16, sfixed8, bool8, uint8, int8, int32, int64) as an HTP graph's I/O would be. Fixed-point
 * tensors carry "encoding": scale_offset (default), bw_scale_offset, axis_scale_offset,
 * bw_axis_scale_offset, block (all emulated) or blockwise_expansion, vector (described with their
 * real structures, not emulated: executing them fails with QNN_COMMON_ERROR_NOT_SUPPORTED).
 *
 * From the environment:
 *   MA_QNN_STUB_API=MAJOR.MINOR  the core API version reported (above)
 *   MA_QNN_STUB_BINFO=1|2|3      QnnSystemContext_BinaryInfo_t version returned (default: the newest
 *                                 the SDK has: 3 from API 2.21, 2 from 2.15, else 1); clamped to it
 *   MA_QNN_STUB_GINFO=1|2|3      QnnSystemContext_GraphInfo_t version (default the SDK's newest)
 *   MA_QNN_STUB_TENSOR=1|2       Qnn_Tensor_t version of the descriptors (default 2 from API 2.14)
 *   MA_QNN_STUB_FAULT=KIND[:SESSION]  reject (contextCreateFromBinary fails), no_graph (graphRetrieve
 *                                 fails), execute_error, crash, crash_once, hang, dsp_restart
 *                                 (graphExecute fails once with QNN_COMMON_ERROR_SYSTEM_COMMUNICATION, 1007,
 *                                 and every later execute on that context fails so until it is freed and
 *                                 created again), dsp_restart_fatal (..._FATAL, 1011, from API 2.17; every
 *                                 execute and context creation fails until a backend is created again),
 *                                 dsp_restart_retrieve (dsp_restart, then the session's next graphRetrieve
 *                                 fails once), vote_fail (setPowerConfig fails: 13003 PERF TRANSPORT),
 *                                 vote_id_fail (createPowerConfigId fails: 13006 PERF FAILED),
 *                                 metadata_fail (getMetadata fails: 30002 OPERATION_FAILED);
 *                                 rpcmem_alloc is the stand-in libcdsprpc.so's (cdsprpc_stub.c)
 *   MA_QNN_STUB_MARK=FILE         crash_once, dsp_restart(_fatal): only while FILE does not exist (then create it)
 *   MA_QNN_STUB_LOG=FILE          append one line per call (the sequence test, the perf votes)
 *   MA_QNN_STUB_GUARD=1           interface tables end at a PROT_NONE page: reading an entry the
 *                                 impersonated SDK does not have faults (default: such entries read NULL)
 *   MA_QNN_STUB_ERRBITS=1         error handles carry bits above the 16-bit code, as QNN_GET_ERROR_CODE allows
 *   MA_QNN_STUB_HTP_API=5.N       the HTP (backend) API version reported (default the SDK's): from 5.48 the HTP
 *                                 device custom config is read in the layout whose union holds a pointer
 *                                 (socModel / arch at byte 8, not 4)
 *
 * The call log (MA_QNN_STUB_LOG) names the environment FastRPC would read at backendCreate
 * (ADSP_LIBRARY_PATH, DSP_LIBRARY_PATH) and, at getBinaryInfo, what the buffer is (a mapping of
 * which file, or anonymous / heap memory); getBinaryInfo writes to its (writable) buffer after
 * reading it, as its signature allows, so a client that hands the same bytes to
 * contextCreateFromBinary afterwards is caught.
 * STUB_DEFAULT_API / STUB_DEFAULT_BINFO (compile-time) replace the two defaults, for runs whose
 * environment is scrubbed of MA_QNN_STUB_*. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/half.h"
#include "kernels/threads.h"
#include "backend/cpu/cpu.h"
#include "runtime/session.h"

#define EXPORT __attribute__((visibility("default")))
#define MAGIC "MA-QNN-STUB 1\n"
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define SA(cond) _Static_assert(cond, #cond)

#ifndef STUB_DEFAULT_API
#define STUB_DEFAULT_API "2.32"
#endif
#ifndef STUB_DEFAULT_BINFO
#define STUB_DEFAULT_BINFO 0 /* the SDK's newest */
#endif

/* ================================================================== the binary interface (LP64) */

typedef uint64_t q_status; /* Qnn_ErrorHandle_t: the code is the low 16 bits */
typedef void *q_handle;
typedef void (*q_fn)(void); /* an interface table slot */

typedef struct { uint32_t major, minor, patch; } q_version;
typedef struct { q_version core, backend; } q_api_version;
SA(sizeof(q_version) == 12 && sizeof(q_api_version) == 24);

/* quantization */
enum { Q_DEF_IMPL_GENERATED = 0, Q_DEF_DEFINED = 1, Q_UNDEFINED = 0x7fffffff };
enum { Q_ENC_SCALE_OFFSET = 0, Q_ENC_AXIS_SCALE_OFFSET = 1, Q_ENC_BW_SCALE_OFFSET = 2, Q_ENC_BW_AXIS_SCALE_OFFSET = 3,
       Q_ENC_BLOCK = 4, Q_ENC_BLOCKWISE_EXPANSION = 5, Q_ENC_VECTOR = 6 };
typedef struct { float scale; int32_t offset; } q_scale_offset;                   /* real = (q + offset) * scale */
typedef struct { uint32_t bitwidth; float scale; int32_t offset; } q_bw_scale_offset;
typedef struct { int32_t axis; uint32_t count; q_scale_offset *per_channel; } q_axis_scale_offset;
typedef struct { uint32_t bitwidth; int32_t axis; uint32_t count; float *scales; int32_t *offsets; } q_bw_axis_scale_offset;
typedef struct { uint32_t *block_size; q_scale_offset *per_block; } q_block;
typedef struct {
    int32_t axis;
    q_scale_offset *per_channel;
    uint32_t blocks_per_axis, block_scale_bits, block_scale_storage; /* storage: 0 = 8-bit, 1 = 16-bit */
    union { uint8_t *s8; uint16_t *s16; } block_scales;
} q_blockwise_expansion;
typedef struct {
    q_bw_axis_scale_offset bw_axis;
    uint32_t rows_per_block, cols_per_block;
    uint8_t vector_dim, vector_stride, index_bits;
} q_vector;
typedef struct {
    uint32_t definition, encoding;
    union {
        q_scale_offset so;
        q_axis_scale_offset axis;
        q_bw_scale_offset bw;
        q_bw_axis_scale_offset bw_axis;
        q_block block;
        q_blockwise_expansion *expansion;
        q_vector *vector;
    } u;
} q_quant;
SA(sizeof(q_scale_offset) == 8 && sizeof(q_bw_scale_offset) == 12 && sizeof(q_axis_scale_offset) == 16);
SA(sizeof(q_bw_axis_scale_offset) == 32 && offsetof(q_bw_axis_scale_offset, scales) == 16);
SA(sizeof(q_blockwise_expansion) == 40 && offsetof(q_blockwise_expansion, block_scales) == 32);
SA(sizeof(q_vector) == 48 && offsetof(q_vector, vector_dim) == 40);
SA(sizeof(q_quant) == 40 && offsetof(q_quant, u) == 8);

/* tensors */
enum { Q_DT_INT_8 = 0x008, Q_DT_INT_32 = 0x032, Q_DT_INT_64 = 0x064, Q_DT_UINT_8 = 0x108, Q_DT_FLOAT_16 = 0x216,
       Q_DT_FLOAT_32 = 0x232, Q_DT_SFIXED_8 = 0x308, Q_DT_SFIXED_16 = 0x316, Q_DT_UFIXED_8 = 0x408,
       Q_DT_UFIXED_16 = 0x416, Q_DT_BOOL_8 = 0x508 };
enum { Q_TENSOR_APP_WRITE = 0, Q_TENSOR_APP_READ = 1 };
enum { Q_MEM_RAW = 0, Q_MEM_HANDLE = 1, Q_MEM_RETRIEVE_RAW = 2 };
typedef struct { void *data; uint32_t size; } q_client_buf;
typedef struct {
    uint32_t id;
    const char *name;
    uint32_t type, format, dtype;
    q_quant quant;
    uint32_t rank;
    uint32_t *dims;
    uint32_t mem_type;
    union { q_client_buf client; q_handle mem; void *retrieve; } buf;
} q_tensor_v1;
typedef struct {
    q_tensor_v1 base; /* version 2 extends version 1 */
    uint8_t *dynamic_dims;
    struct { uint32_t layout, specified, sparse_dims; } sparse;
    uint8_t produced;
} q_tensor_v2;
typedef struct { uint32_t version; union { q_tensor_v1 v1; q_tensor_v2 v2; } u; } q_tensor;
SA(offsetof(q_tensor_v1, quant) == 32 && offsetof(q_tensor_v1, rank) == 72 && offsetof(q_tensor_v1, dims) == 80);
SA(offsetof(q_tensor_v1, mem_type) == 88 && offsetof(q_tensor_v1, buf) == 96 && sizeof(q_tensor_v1) == 112);
SA(offsetof(q_tensor_v2, dynamic_dims) == 112 && offsetof(q_tensor_v2, produced) == 132 && sizeof(q_tensor_v2) == 136);
SA(offsetof(q_tensor, u) == 8 && sizeof(q_tensor) == 144);

/* system context: graph info (versioned, the union grew with the SDKs) and binary info */
typedef struct { const char *name; uint32_t n_in; q_tensor *in; uint32_t n_out; q_tensor *out; } q_graph_v1;
typedef struct { q_graph_v1 v1; uint32_t n_updateable; q_tensor *updateable; } q_graph_v2;
typedef struct { q_graph_v2 v2; uint32_t blob_size; void *blob; uint32_t first_op, last_op; } q_graph_v3;
SA(sizeof(q_graph_v1) == 40 && sizeof(q_graph_v2) == 56 && sizeof(q_graph_v3) == 80);
#define Q_GRAPH_BODY 8 /* the union's offset after the 32-bit version */

typedef struct {
    uint32_t backend_id;
    const char *build_id;
    q_version core_api, backend_api;
    const char *soc;
    q_version hw_blob_version, blob_version;
    uint32_t hw_blob_size;
    void *hw_blob;
    uint64_t blob_size;
    uint32_t n_tensors;
    q_tensor *tensors;
    uint32_t n_graphs;
    void *graphs; /* records of the SDK's graph info size */
} q_binary_v1;
typedef struct { q_binary_v1 v1; void *platform; } q_binary_v2;
typedef struct {
    uint32_t backend_id;
    const char *build_id;
    q_version core_api, backend_api;
    const char *soc;
    q_version blob_version;
    uint64_t blob_size;
    uint32_t n_tensors;
    q_tensor *tensors;
    uint32_t n_graphs;
    void *graphs;
    void *platform;
    uint32_t metadata_size;
    void *metadata;
    uint32_t soc_model;
} q_binary_v3;
typedef struct { uint32_t version; union { q_binary_v1 v1; q_binary_v2 v2; q_binary_v3 v3; } u; } q_binary_info;
SA(offsetof(q_binary_v1, n_graphs) == 112 && offsetof(q_binary_v1, graphs) == 120 && sizeof(q_binary_v1) == 128);
SA(offsetof(q_binary_v2, platform) == 128 && sizeof(q_binary_v2) == 136);
SA(offsetof(q_binary_v3, blob_size) == 64 && offsetof(q_binary_v3, n_graphs) == 88 && offsetof(q_binary_v3, graphs) == 96);
SA(offsetof(q_binary_v3, soc_model) == 128 && sizeof(q_binary_v3) == 136);
SA(offsetof(q_binary_info, u) == 8 && sizeof(q_binary_info) == 144);

/* interface tables: a header, then function pointers in the SDK's order */
typedef struct { uint32_t backend_id; const char *name; q_api_version api; q_fn fn[]; } q_interface;
typedef struct { uint32_t backend_id; const char *name; q_version sys_api; q_fn fn[]; } q_sys_interface;
SA(offsetof(q_interface, fn) == 40 && offsetof(q_sys_interface, fn) == 32);
#define Q_BACKEND_HTP 6

#define CORE_TABLE(X)                                                                                               \
    X(propertyHasCapability) X(backendCreate) X(backendSetConfig) X(backendGetApiVersion) X(backendGetBuildId)     \
    X(backendRegisterOpPackage) X(backendGetSupportedOperations) X(backendValidateOpConfig) X(backendFree)         \
    X(contextCreate) X(contextSetConfig) X(contextGetBinarySize) X(contextGetBinary) X(contextCreateFromBinary)    \
    X(contextFree) X(graphCreate) X(graphCreateSubgraph) X(graphSetConfig) X(graphAddNode) X(graphFinalize)        \
    X(graphRetrieve) X(graphExecute) X(graphExecuteAsync) X(tensorCreateContextTensor) X(tensorCreateGraphTensor)  \
    X(logCreate) X(logSetLogLevel) X(logFree) X(profileCreate) X(profileSetConfig) X(profileGetEvents)            \
    X(profileGetSubEvents) X(profileGetEventData) X(profileGetExtendedEventData) X(profileFree) X(memRegister)     \
    X(memDeRegister) X(deviceGetPlatformInfo) X(deviceFreePlatformInfo) X(deviceGetInfrastructure) X(deviceCreate) \
    X(deviceSetConfig) X(deviceGetInfo) X(deviceFree) X(signalCreate) X(signalSetConfig) X(signalTrigger)         \
    X(signalFree) X(errorGetMessage) X(errorGetVerboseMessage) X(errorFreeVerboseMessage)                          \
    X(graphPrepareExecutionEnvironment) X(graphReleaseExecutionEnvironment) X(graphGetProperty)                    \
    X(contextValidateBinary) X(contextCreateFromBinaryWithSignal) X(contextCreateFromBinaryListAsync)              \
    X(tensorUpdateGraphTensors) X(tensorUpdateContextTensors) X(contextGetBinarySectionSize)                       \
    X(contextGetBinarySection) X(contextApplyBinarySection) X(backendGetProperty) X(contextGetProperty)            \
    X(contextGetIncrementalBinary) X(contextReleaseIncrementalBinary) X(contextFinalize) X(globalConfigSet)        \
    X(contextCreateFromBinaryWithCallback) X(contextGetBinarySectionUpdate) X(contextFreeBinarySectionUpdate)
#define SYS_TABLE(X)                                                                                                \
    X(systemContextCreate) X(systemContextGetBinaryInfo) X(systemContextGetMetaData) X(systemContextFree)          \
    X(systemTensorGetMemoryFootprint) X(systemLogCreate) X(systemLogSetLogLevel) X(systemLogFree)                  \
    X(systemDlcCreateFromFile) X(systemDlcCreateFromBinary) X(systemDlcComposeGraphs) X(systemDlcGetOpMappings)    \
    X(systemDlcFree) X(systemProfileCreateSerializationTarget) X(systemProfileSerializeEventData)                  \
    X(systemProfileFreeSerializationTarget)
#define AS_INDEX(n) CI_##n,
#define AS_SYS_INDEX(n) SI_##n,
#define AS_NAME(n) #n,
enum { CORE_TABLE(AS_INDEX) CI_COUNT };
enum { SYS_TABLE(AS_SYS_INDEX) SI_COUNT };
static const char *const core_names[] = {CORE_TABLE(AS_NAME)};
static const char *const sys_names[] = {SYS_TABLE(AS_NAME)};
SA(CI_COUNT == 71 && CI_graphGetProperty == 53 && CI_memRegister == 35 && CI_deviceGetInfrastructure == 39);
SA(CI_errorGetMessage == 48 && CI_graphExecute == 21 && CI_contextCreateFromBinary == 13 && CI_logCreate == 25);
SA(SI_COUNT == 16 && SI_systemContextFree == 3);

/* devices: configs and the HTP perf infrastructure */
typedef struct { uint32_t option; union { void *custom; void *platform; } u; } q_device_config;
typedef struct {
    uint32_t option;
    union {
        uint32_t soc_model;
        struct { uint32_t device_id, arch; } arch;
        struct { uint32_t device_id; bool on; } pd;
    } u;
} q_htp_device_config;
/* from HTP API 5.48 the union also holds a pointer (an extension config): 8-aligned */
typedef struct {
    uint32_t option;
    union {
        uint32_t soc_model;
        struct { uint32_t device_id, arch; } arch;
        struct { uint32_t device_id; bool on; } pd;
        void *extension;
    } u;
} q_htp_device_config_548;
SA(sizeof(q_device_config) == 16 && sizeof(q_htp_device_config) == 12 && offsetof(q_htp_device_config, u) == 4);
SA(sizeof(q_htp_device_config_548) == 16 && offsetof(q_htp_device_config_548, u) == 8);
enum { Q_DEVICE_CONFIG_CUSTOM = 0, Q_DEVICE_CONFIG_PLATFORM_INFO = 1 };
enum { Q_HTP_CONFIG_SOC = 0, Q_HTP_CONFIG_ARCH = 1, Q_HTP_CONFIG_SIGNEDPD = 2, Q_HTP_CONFIG_SECUREPD = 3 };

typedef struct {
    uint32_t context_id, set_dcvs_enable, dcvs_enable, power_mode, set_sleep_latency, sleep_latency, set_sleep_disable,
        sleep_disable, set_bus_params, bus_min, bus_target, bus_max, set_core_params, core_min, core_target, core_max;
} q_dcvs_v3;
typedef struct { uint32_t pick_default, corner_min, corner_target, corner_max, perf_mode; } q_hmx_v2;
typedef struct {
    uint32_t option;
    union {
        q_dcvs_v3 dcvs_v3;
        uint32_t rpc_control_latency, rpc_polling_time, hmx_timeout_us;
        q_hmx_v2 hmx_v2;
        uint32_t adaptive_polling_time, ddr_perf_mode;
    } u;
} q_power_config;
typedef struct { uint32_t option; union { uint32_t grow_size; } u; } q_memory_config;
typedef struct {
    q_status (*create_power_config_id)(uint32_t device_id, uint32_t core_id, uint32_t *id);
    q_status (*destroy_power_config_id)(uint32_t id);
    q_status (*set_power_config)(uint32_t id, const q_power_config **list);
    q_status (*set_memory_config)(uint32_t device_id, uint32_t core_id, const q_memory_config **list);
} q_perf_infra;
typedef struct { uint32_t type; union { q_perf_infra perf; } u; } q_htp_infra;
SA(sizeof(q_dcvs_v3) == 64 && offsetof(q_dcvs_v3, sleep_latency) == 20 && offsetof(q_dcvs_v3, bus_min) == 36);
SA(offsetof(q_dcvs_v3, core_min) == 52 && sizeof(q_hmx_v2) == 20);
SA(sizeof(q_power_config) == 68 && offsetof(q_power_config, u) == 4);
SA(sizeof(q_htp_infra) == 40 && offsetof(q_htp_infra, u) == 8);
enum { Q_POWER_DCVS_V3 = 1, Q_POWER_RPC_CONTROL_LATENCY = 2, Q_POWER_RPC_POLLING_TIME = 3, Q_POWER_HMX_TIMEOUT = 4,
       Q_POWER_HMX_V2 = 5, Q_POWER_ADAPTIVE_POLLING = 6, Q_POWER_DDR_PERF_MODE = 7 };
enum { Q_INFRA_PERF = 0 };

/* registered memory */
typedef struct { uint32_t rank; uint32_t *dims; const char *shape_config; } q_mem_shape;
typedef struct {
    q_mem_shape shape;
    uint32_t dtype, mem_type;
    union { struct { int32_t fd; } ion; void *custom; struct { int32_t fd; void *data; } dma_buf; } u;
} q_mem_desc;
typedef struct {
    uint32_t type;
    uint64_t size;
    union { uint32_t qurt_address; struct { int32_t fd; uint64_t offset; } shared; } u;
} q_htp_mem_desc;
SA(sizeof(q_mem_shape) == 24 && offsetof(q_mem_desc, dtype) == 24 && offsetof(q_mem_desc, mem_type) == 28);
SA(offsetof(q_mem_desc, u) == 32 && sizeof(q_mem_desc) == 48);
SA(sizeof(q_htp_mem_desc) == 32 && offsetof(q_htp_mem_desc, u) == 16);
enum { Q_MEMTYPE_ION = 1, Q_MEMTYPE_CUSTOM = 2, Q_MEMTYPE_DMA_BUF = 3 };
enum { Q_HTP_MEM_SHARED_BUFFER = 1 };

/* logging */
typedef void (*q_log_cb)(const char *fmt, uint32_t level, uint64_t timestamp, va_list ap);
enum { Q_LOG_ERROR = 1, Q_LOG_WARN = 2, Q_LOG_INFO = 3, Q_LOG_VERBOSE = 4, Q_LOG_DEBUG = 5 };

/* ================================================================== error codes */

enum {
    E_OK = 0,
    E_NOT_SUPPORTED = 1000, E_MEM_ALLOC = 1002, E_SYSTEM = 1003, E_INVALID_ARGUMENT = 1004, E_NOT_PERMITTED = 1005,
    E_PLATFORM_NOT_SUPPORTED = 1006, E_SYSTEM_COMMUNICATION = 1007, E_INCOMPATIBLE_BINARIES = 1008,
    E_LOADING_BINARIES = 1009, E_RESOURCE_UNAVAILABLE = 1010, E_SYSTEM_COMMUNICATION_FATAL = 1011, E_GENERAL = 1100,
    E_PROPERTY_UNKNOWN_KEY = 2000,
    E_BACKEND_INVALID_ARGUMENT = 4004, E_BACKEND_INVALID_HANDLE = 4011,
    E_CTX_INVALID_ARGUMENT = 5000, E_CTX_DOES_NOT_EXIST = 5001, E_CTX_INVALID_HANDLE = 5002,
    E_CTX_NOT_FINALIZED = 5003, E_CTX_BINARY_VERSION = 5004, E_CTX_CREATE_FROM_BINARY = 5005,
    E_CTX_GET_BINARY_SIZE_FAILED = 5006, E_CTX_GET_BINARY_FAILED = 5007, E_CTX_BINARY_CONFIGURATION = 5008,
    E_CTX_SET_PROFILE = 5009, E_CTX_INVALID_CONFIG = 5010, E_CTX_BINARY_SUBOPTIMAL = 5011,
    E_GRAPH_INVALID_ARGUMENT = 6000, E_GRAPH_INVALID_HANDLE = 6001, E_GRAPH_DOES_NOT_EXIST = 6002,
    E_GRAPH_INVALID_NAME = 6003, E_GRAPH_INVALID_TENSOR = 6004, E_GRAPH_NOT_FINALIZED = 6023,
    E_GRAPH_TIMED_OUT = 6033, E_GRAPH_INVALID_CONTEXT = 6039,
    E_MEM_INVALID_ARGUMENT = 8000, E_MEM_INVALID_HANDLE = 8001, E_MEM_ALREADY_REGISTERED = 8002, E_MEM_MAPPING = 8003,
    E_MEM_INVALID_SHAPE = 8004, E_MEM_UNSUPPORTED_MEMTYPE = 8005,
    E_ERROR_INVALID_ARGUMENT = 10000, E_ERROR_INVALID_HANDLE = 10001,
    E_LOG_INVALID_ARGUMENT = 11003, E_LOG_INVALID_HANDLE = 11004,
    E_PERF_INVALID_HANDLE_PTR = 13000, E_PERF_INVALID_INPUT = 13001, E_PERF_UNSUPPORTED_CONFIG = 13002,
    E_PERF_TRANSPORT = 13003, E_PERF_UNSUPPORTED = 13004, E_PERF_MEM_ALLOC = 13005, E_PERF_FAILED = 13006,
    E_DEVICE_INVALID_HANDLE = 14000, E_DEVICE_INVALID_CONFIG = 14001, E_DEVICE_HARDWARE_UNAVAILABLE = 14002,
    E_SYS_INVALID_HANDLE = 30000, E_SYS_INVALID_ARGUMENT = 30001, E_SYS_OPERATION_FAILED = 30002,
    E_SYS_MALFORMED_BINARY = 30010,
    E_INTERFACE_INVALID_PARAMETER = 1004,
};

/* the name a code has in the SDK (components share the common range: those read as common) */
static const struct { unsigned code; const char *name; } code_names[] = {
    {E_OK, "QNN_SUCCESS"},
    {E_NOT_SUPPORTED, "QNN_COMMON_ERROR_NOT_SUPPORTED"},
    {E_MEM_ALLOC, "QNN_COMMON_ERROR_MEM_ALLOC"},
    {E_SYSTEM, "QNN_COMMON_ERROR_SYSTEM"},
    {E_INVALID_ARGUMENT, "QNN_COMMON_ERROR_INVALID_ARGUMENT"},
    {E_NOT_PERMITTED, "QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED"},
    {E_PLATFORM_NOT_SUPPORTED, "QNN_COMMON_ERROR_PLATFORM_NOT_SUPPORTED"},
    {E_SYSTEM_COMMUNICATION, "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION"},
    {E_INCOMPATIBLE_BINARIES, "QNN_COMMON_ERROR_INCOMPATIBLE_BINARIES"},
    {E_LOADING_BINARIES, "QNN_COMMON_ERROR_LOADING_BINARIES"},
    {E_RESOURCE_UNAVAILABLE, "QNN_COMMON_ERROR_RESOURCE_UNAVAILABLE"},
    {E_SYSTEM_COMMUNICATION_FATAL, "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION_FATAL"},
    {E_GENERAL, "QNN_COMMON_ERROR_GENERAL"},
    {E_PROPERTY_UNKNOWN_KEY, "QNN_PROPERTY_ERROR_UNKNOWN_KEY"},
    {4000, "QNN_BACKEND_ERROR_CANNOT_INITIALIZE"},
    {4002, "QNN_BACKEND_ERROR_TERMINATE_FAILED"},
    {4003, "QNN_BACKEND_ERROR_NOT_SUPPORTED"},
    {E_BACKEND_INVALID_ARGUMENT, "QNN_BACKEND_ERROR_INVALID_ARGUMENT"},
    {4010, "QNN_BACKEND_ERROR_INCONSISTENT_CONFIG"},
    {E_BACKEND_INVALID_HANDLE, "QNN_BACKEND_ERROR_INVALID_HANDLE"},
    {4012, "QNN_BACKEND_ERROR_INVALID_CONFIG"},
    {E_CTX_INVALID_ARGUMENT, "QNN_CONTEXT_ERROR_INVALID_ARGUMENT"},
    {E_CTX_DOES_NOT_EXIST, "QNN_CONTEXT_ERROR_CTX_DOES_NOT_EXIST"},
    {E_CTX_INVALID_HANDLE, "QNN_CONTEXT_ERROR_INVALID_HANDLE"},
    {E_CTX_NOT_FINALIZED, "QNN_CONTEXT_ERROR_NOT_FINALIZED"},
    {E_CTX_BINARY_VERSION, "QNN_CONTEXT_ERROR_BINARY_VERSION"},
    {E_CTX_CREATE_FROM_BINARY, "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY"},
    {E_CTX_GET_BINARY_SIZE_FAILED, "QNN_CONTEXT_ERROR_GET_BINARY_SIZE_FAILED"},
    {E_CTX_GET_BINARY_FAILED, "QNN_CONTEXT_ERROR_GET_BINARY_FAILED"},
    {E_CTX_BINARY_CONFIGURATION, "QNN_CONTEXT_ERROR_BINARY_CONFIGURATION"},
    {E_CTX_SET_PROFILE, "QNN_CONTEXT_ERROR_SET_PROFILE"},
    {E_CTX_INVALID_CONFIG, "QNN_CONTEXT_ERROR_INVALID_CONFIG"},
    {E_CTX_BINARY_SUBOPTIMAL, "QNN_CONTEXT_ERROR_BINARY_SUBOPTIMAL"},
    {5012, "QNN_CONTEXT_ERROR_ABORTED"},
    {5013, "QNN_CONTEXT_ERROR_TIMED_OUT"},
    {E_GRAPH_INVALID_ARGUMENT, "QNN_GRAPH_ERROR_INVALID_ARGUMENT"},
    {E_GRAPH_INVALID_HANDLE, "QNN_GRAPH_ERROR_INVALID_HANDLE"},
    {E_GRAPH_DOES_NOT_EXIST, "QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST"},
    {E_GRAPH_INVALID_NAME, "QNN_GRAPH_ERROR_INVALID_NAME"},
    {E_GRAPH_INVALID_TENSOR, "QNN_GRAPH_ERROR_INVALID_TENSOR"},
    {6005, "QNN_GRAPH_ERROR_INVALID_OP_CONFIG"},
    {6006, "QNN_GRAPH_ERROR_SET_PROFILE"},
    {6020, "QNN_GRAPH_ERROR_CREATE_FAILED"},
    {6022, "QNN_GRAPH_ERROR_FINALIZE_FAILED"},
    {E_GRAPH_NOT_FINALIZED, "QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED"},
    {6031, "QNN_GRAPH_ERROR_ABORTED"},
    {E_GRAPH_TIMED_OUT, "QNN_GRAPH_ERROR_TIMED_OUT"},
    {6034, "QNN_GRAPH_ERROR_SUBGRAPH"},
    {6035, "QNN_GRAPH_ERROR_DISABLED"},
    {6036, "QNN_GRAPH_ERROR_DYNAMIC_TENSOR_SHAPE"},
    {6038, "QNN_GRAPH_ERROR_EARLY_TERMINATION"},
    {E_GRAPH_INVALID_CONTEXT, "QNN_GRAPH_ERROR_INVALID_CONTEXT"},
    {7001, "QNN_TENSOR_ERROR_INVALID_HANDLE"},
    {7002, "QNN_TENSOR_ERROR_DOES_NOT_EXIST"},
    {E_MEM_INVALID_ARGUMENT, "QNN_MEM_ERROR_INVALID_ARGUMENT"},
    {E_MEM_INVALID_HANDLE, "QNN_MEM_ERROR_INVALID_HANDLE"},
    {E_MEM_ALREADY_REGISTERED, "QNN_MEM_ERROR_ALREADY_REGISTERED"},
    {E_MEM_MAPPING, "QNN_MEM_ERROR_MAPPING"},
    {E_MEM_INVALID_SHAPE, "QNN_MEM_ERROR_INVALID_SHAPE"},
    {E_MEM_UNSUPPORTED_MEMTYPE, "QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE"},
    {E_ERROR_INVALID_ARGUMENT, "QNN_ERROR_INVALID_ARGUMENT"},
    {E_ERROR_INVALID_HANDLE, "QNN_ERROR_INVALID_ERROR_HANDLE"},
    {11002, "QNN_LOG_ERROR_INITIALIZATION"},
    {E_LOG_INVALID_ARGUMENT, "QNN_LOG_ERROR_INVALID_ARGUMENT"},
    {E_LOG_INVALID_HANDLE, "QNN_LOG_ERROR_INVALID_HANDLE"},
    {E_PERF_INVALID_HANDLE_PTR, "QNN_HTP_PERF_INFRASTRUCTURE_ERROR_INVALID_HANDLE_PTR"},
    {E_PERF_INVALID_INPUT, "QNN_HTP_PERF_INFRASTRUCTURE_ERROR_INVALID_INPUT"},
    {E_PERF_UNSUPPORTED_CONFIG, "QNN_HTP_PERF_INFRASTRUCTURE_ERROR_UNSUPPORTED_CONFIG"},
    {E_PERF_TRANSPORT, "QNN_HTP_PERF_INFRASTRUCTURE_ERROR_TRANSPORT"},
    {E_PERF_UNSUPPORTED, "QNN_HTP_PERF_INFRASTRUCTURE_ERROR_UNSUPPORTED"},
    {E_PERF_MEM_ALLOC, "QNN_HTP_PERF_INFRASTRUCTURE_ERROR_MEM_ALLOC"},
    {E_PERF_FAILED, "QNN_HTP_PERF_INFRASTRUCTURE_ERROR_FAILED"},
    {E_DEVICE_INVALID_HANDLE, "QNN_DEVICE_ERROR_INVALID_HANDLE"},
    {E_DEVICE_INVALID_CONFIG, "QNN_DEVICE_ERROR_INVALID_CONFIG"},
    {E_DEVICE_HARDWARE_UNAVAILABLE, "QNN_DEVICE_ERROR_HARDWARE_UNAVAILABLE"},
    {14003, "QNN_DEVICE_ERROR_ASSOCIATED_TO_CONTEXT"},
    {E_SYS_INVALID_HANDLE, "QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE"},
    {E_SYS_INVALID_ARGUMENT, "QNN_SYSTEM_CONTEXT_ERROR_INVALID_ARGUMENT"},
    {E_SYS_OPERATION_FAILED, "QNN_SYSTEM_CONTEXT_ERROR_OPERATION_FAILED"},
    {E_SYS_MALFORMED_BINARY, "QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY"},
};

static const char *code_name(unsigned code) {
    for (size_t i = 0; i < COUNT(code_names); i++)
        if (code_names[i].code == code) return code_names[i].name;
    return NULL;
}

/* ================================================================== the SDK impersonated */

typedef struct {
    unsigned major, minor;
    const char *sdk;           /* the QAIRT release whose headers give these numbers ("" between known ones) */
    q_version sys_api, htp_api;
    unsigned core_entries;     /* interface table length */
    unsigned sys_entries;
    unsigned graph_info_max;   /* newest QnnSystemContext_GraphInfo_t version */
    size_t graph_info_size;    /* sizeof(QnnSystemContext_GraphInfo_t): the graphs array stride */
    unsigned binary_info_max;
    unsigned tensor_version;   /* Qnn_TensorV2_t from API 2.14 */
    bool has_metadata;         /* QnnSystemContext_getMetadata: system API 1.1 (QAIRT 2.13, core API 2.7.x) */
    bool has_ssr_fatal;        /* QNN_COMMON_ERROR_SYSTEM_COMMUNICATION_FATAL: API 2.17 */
} sdk_profile;

static const struct { unsigned minor; const char *sdk; q_version sys, htp; } known_sdks[] = {
    {15, "2.22.6", {1, 1, 0}, {5, 22, 0}}, {18, "2.25.0", {1, 1, 0}, {5, 25, 0}}, {27, "2.36.1", {1, 4, 0}, {5, 36, 0}},
    {30, "2.40.0", {1, 6, 0}, {5, 40, 0}}, {32, "2.43.0", {1, 7, 0}, {5, 43, 0}},
};

static unsigned core_entries_for(unsigned minor) {
    /* the API version that appended each group of entries (QNN API revision history; the counts at
     * 2.15 / 2.18 / 2.27 / 2.30 / 2.32 are those of the QAIRT 2.22 / 2.25 / 2.36 / 2.40 / 2.43 headers) */
    static const struct { unsigned minor, entries; } steps[] = {
        {32, 71}, {28, 69}, {27, 68}, {26, 67}, {25, 66}, {22, 64}, {18, 62}, {17, 59}, {15, 56}, {13, 55}, {12, 54}, {11, 51}};
    for (size_t i = 0; i < COUNT(steps); i++)
        if (minor >= steps[i].minor) return steps[i].entries;
    return 48;
}

static sdk_profile P;
static unsigned binfo_version, ginfo_version, tensor_version;
static bool guard_tables, err_bits;

static unsigned env_uint(const char *name, unsigned dflt) {
    const char *v = getenv(name);
    return v && *v ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

static void setup_once(void) {
    const char *api = getenv("MA_QNN_STUB_API");
    unsigned major = 2, minor = 32;
    if (!api || sscanf(api, "%u.%u", &major, &minor) != 2) sscanf(STUB_DEFAULT_API, "%u.%u", &major, &minor);
    memset(&P, 0, sizeof P);
    P.major = major;
    P.minor = minor;
    P.sdk = "";
    P.sys_api = (q_version){1, minor >= 8 ? 1 : 0, 0};
    P.htp_api = (q_version){5, 0, 0};
    for (size_t i = 0; i < COUNT(known_sdks); i++)
        if (minor >= known_sdks[i].minor) {
            P.sys_api = known_sdks[i].sys;
            P.htp_api = known_sdks[i].htp;
            P.sdk = minor == known_sdks[i].minor ? known_sdks[i].sdk : "";
        }
    P.core_entries = core_entries_for(minor);
    P.sys_entries = minor >= 30 ? 16 : minor >= 27 ? 13 : 4;
    P.graph_info_max = minor >= 21 ? 3 : minor >= 17 ? 2 : 1;
    P.graph_info_size = Q_GRAPH_BODY + (minor >= 21 ? sizeof(q_graph_v3) : minor >= 17 ? sizeof(q_graph_v2) : sizeof(q_graph_v1));
    P.binary_info_max = minor >= 21 ? 3 : minor >= 15 ? 2 : 1;
    P.tensor_version = minor >= 14 ? 2 : 1;
    P.has_metadata = minor >= 8;
    P.has_ssr_fatal = minor >= 17;

    unsigned b = env_uint("MA_QNN_STUB_BINFO", STUB_DEFAULT_BINFO);
    binfo_version = b == 0 || b > P.binary_info_max ? P.binary_info_max : b;
    unsigned g = env_uint("MA_QNN_STUB_GINFO", 0);
    ginfo_version = g == 0 || g > P.graph_info_max ? P.graph_info_max : g;
    unsigned t = env_uint("MA_QNN_STUB_TENSOR", 0);
    tensor_version = t == 0 || t > P.tensor_version ? P.tensor_version : t;
    guard_tables = env_uint("MA_QNN_STUB_GUARD", 0) != 0;
    const char *htp = getenv("MA_QNN_STUB_HTP_API");
    unsigned hmaj, hmin;
    if (htp && sscanf(htp, "%u.%u", &hmaj, &hmin) == 2) P.htp_api = (q_version){hmaj, hmin, 0};
    err_bits = env_uint("MA_QNN_STUB_ERRBITS", 0) != 0;
}

static void setup(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, setup_once);
}

/* ================================================================== tracing, errors, faults */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...) {
    const char *p = getenv("MA_QNN_STUB_LOG");
    if (!p) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    int fd = open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    size_t n = strlen(line);
    line[n] = '\n'; /* vsnprintf left room: n < sizeof line */
    if (write(fd, line, n + 1) < 0) { /* nothing to do */ }
    close(fd);
}

static _Thread_local unsigned last_code;
static _Thread_local char last_detail[768], message[1024];

static q_status status_of(unsigned code) {
    /* the code in the low 16 bits; with MA_QNN_STUB_ERRBITS the library's own bits above it */
    return code && err_bits ? ((uint64_t)0x6a5 << 16) | code : code;
}

static q_status fail(unsigned code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static q_status fail(unsigned code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_detail, sizeof last_detail, fmt, ap);
    va_end(ap);
    last_code = code;
    return status_of(code);
}

/* the fault asked for this session, or NULL */
static const char *fault(const char *session) {
    static _Thread_local char kind[64];
    const char *f = getenv("MA_QNN_STUB_FAULT");
    if (!f || !*f) return NULL;
    const char *colon = strchr(f, ':');
    size_t n = colon ? (size_t)(colon - f) : strlen(f);
    if (n >= sizeof kind) return NULL;
    if (colon && (!session || strcmp(colon + 1, session))) return NULL;
    memcpy(kind, f, n);
    kind[n] = 0;
    return kind;
}

/* a fault that fires once: while MA_QNN_STUB_MARK does not exist (then it is created), else once a process */
static bool fire_once(bool *fired) {
    const char *mark = getenv("MA_QNN_STUB_MARK");
    if (mark) {
        if (access(mark, F_OK) == 0) return false;
        int fd = open(mark, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        if (fd >= 0) close(fd);
        return true;
    }
    if (*fired) return false;
    *fired = true;
    return true;
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ================================================================== context files */

enum { ENC_NONE = -1 };

typedef struct stub_tensor {
    char name[64];
    uint32_t dims[MA_MAX_DIMS], rank, dtype;
    int encoding; /* Q_ENC_* for fixed-point types, ENC_NONE otherwise */
    float scale;
    int32_t offset;
    uint32_t bitwidth;
    int32_t axis;
    uint32_t n_params;            /* per-channel or per-block scale/offset pairs */
    float *scales;
    int32_t *offsets;
    q_scale_offset *pairs;        /* the same, as the SDK lays them out */
    uint32_t block_size[MA_MAX_DIMS];
    uint32_t blocks_per_axis, block_scale_bits;
    uint8_t *block_scales;
    q_blockwise_expansion expansion;
    q_vector vector;
} stub_tensor;

typedef struct stub_graph {
    char name[256], session[32]; /* graph names up to 255 bytes */
    int n_in, n_out;
    stub_tensor in[MA_SESSION_MAX_IO], out[MA_SESSION_MAX_IO];
} stub_graph;

typedef struct stub_file {
    char model[1024];
    uint32_t soc_model;
    int n_graphs;
    stub_graph *graphs;
} stub_file;

static const struct { const char *name; uint32_t dt; } dtypes[] = {
    {"float32", Q_DT_FLOAT_32}, {"float16", Q_DT_FLOAT_16}, {"ufixed16", Q_DT_UFIXED_16}, {"ufixed8", Q_DT_UFIXED_8},
    {"sfixed16", Q_DT_SFIXED_16}, {"sfixed8", Q_DT_SFIXED_8}, {"bool8", Q_DT_BOOL_8}, {"uint8", Q_DT_UINT_8},
    {"int8", Q_DT_INT_8}, {"int32", Q_DT_INT_32}, {"int64", Q_DT_INT_64}};
static const char *const encodings[] = {"scale_offset", "axis_scale_offset", "bw_scale_offset", "bw_axis_scale_offset",
                                        "block", "blockwise_expansion", "vector"};

static uint32_t dtype_of(const char *s) {
    for (size_t i = 0; i < COUNT(dtypes); i++)
        if (!strcmp(s, dtypes[i].name)) return dtypes[i].dt;
    return 0;
}
static bool dtype_known(uint32_t dt) {
    for (size_t i = 0; i < COUNT(dtypes); i++)
        if (dtypes[i].dt == dt) return true;
    return false;
}
static bool is_fixed(uint32_t dt) { return (dt & 0xf00) == 0x300 || (dt & 0xf00) == 0x400; }
static size_t elem_bytes(uint32_t dt) {
    switch (dt & 0xff) {
    case 0x08: return 1;
    case 0x16: return 2;
    case 0x32: return 4;
    default: return 8;
    }
}
static size_t numel(const uint32_t *dims, uint32_t rank) {
    size_t n = 1;
    for (uint32_t k = 0; k < rank; k++) n *= dims[k];
    return n;
}

static void free_tensor(stub_tensor *t) {
    free(t->scales);
    free(t->offsets);
    free(t->pairs);
    free(t->block_scales);
    t->scales = NULL, t->offsets = NULL, t->pairs = NULL, t->block_scales = NULL;
}

static void free_file(stub_file *f) {
    for (int g = 0; g < f->n_graphs; g++) {
        for (int i = 0; i < f->graphs[g].n_in; i++) free_tensor(&f->graphs[g].in[i]);
        for (int i = 0; i < f->graphs[g].n_out; i++) free_tensor(&f->graphs[g].out[i]);
    }
    free(f->graphs);
    memset(f, 0, sizeof *f);
}

static int json_floats(const cJSON *a, uint32_t n, float **out) {
    if (!cJSON_IsArray(a) || (uint32_t)cJSON_GetArraySize(a) != n) return -1;
    *out = calloc(n ? n : 1, sizeof **out);
    const cJSON *e;
    uint32_t i = 0;
    cJSON_ArrayForEach(e, a) (*out)[i++] = (float)e->valuedouble;
    return 0;
}
static int json_ints(const cJSON *a, uint32_t n, int32_t **out) {
    if (!cJSON_IsArray(a) || (uint32_t)cJSON_GetArraySize(a) != n) return -1;
    *out = calloc(n ? n : 1, sizeof **out);
    const cJSON *e;
    uint32_t i = 0;
    cJSON_ArrayForEach(e, a) (*out)[i++] = (int32_t)e->valuedouble;
    return 0;
}

static int parse_quant(const cJSON *e, stub_tensor *x, char *why, size_t wn) {
    const cJSON *enc = cJSON_GetObjectItem(e, "encoding"), *sc = cJSON_GetObjectItem(e, "scale"),
                *of = cJSON_GetObjectItem(e, "offset"), *bw = cJSON_GetObjectItem(e, "bitwidth"),
                *ax = cJSON_GetObjectItem(e, "axis");
    x->encoding = ENC_NONE;
    if (!is_fixed(x->dtype)) return 0;
    x->encoding = Q_ENC_SCALE_OFFSET;
    if (cJSON_IsString(enc)) {
        x->encoding = -2;
        for (size_t i = 0; i < COUNT(encodings); i++)
            if (!strcmp(enc->valuestring, encodings[i])) x->encoding = (int)i;
        if (x->encoding < 0) return snprintf(why, wn, "tensor %s: unknown encoding %s", x->name, enc->valuestring), -1;
    }
    x->scale = cJSON_IsNumber(sc) ? (float)sc->valuedouble : 1.0f;
    x->offset = cJSON_IsNumber(of) ? (int32_t)of->valuedouble : 0;
    x->bitwidth = cJSON_IsNumber(bw) ? (uint32_t)bw->valuedouble : (uint32_t)(8 * elem_bytes(x->dtype));
    x->axis = cJSON_IsNumber(ax) ? (int32_t)ax->valuedouble : (int32_t)x->rank - 1;
    const cJSON *scales = cJSON_GetObjectItem(e, "scales"), *offsets = cJSON_GetObjectItem(e, "offsets");
    switch (x->encoding) {
    case Q_ENC_AXIS_SCALE_OFFSET:
    case Q_ENC_BW_AXIS_SCALE_OFFSET:
    case Q_ENC_BLOCKWISE_EXPANSION:
    case Q_ENC_VECTOR:
        if (x->axis < 0 || (uint32_t)x->axis >= x->rank)
            return snprintf(why, wn, "tensor %s: axis %d outside rank %u", x->name, x->axis, x->rank), -1;
        x->n_params = x->dims[x->axis];
        break;
    case Q_ENC_BLOCK: {
        const cJSON *bs = cJSON_GetObjectItem(e, "block_size"), *d;
        if (!cJSON_IsArray(bs) || (uint32_t)cJSON_GetArraySize(bs) != x->rank)
            return snprintf(why, wn, "tensor %s: block_size needs %u entries", x->name, x->rank), -1;
        uint32_t k = 0;
        x->n_params = 1;
        cJSON_ArrayForEach(d, bs) {
            x->block_size[k] = (uint32_t)d->valuedouble;
            if (!x->block_size[k] || x->dims[k] % x->block_size[k])
                return snprintf(why, wn, "tensor %s: block size %u does not divide dimension %u", x->name, x->block_size[k], x->dims[k]), -1;
            x->n_params *= x->dims[k] / x->block_size[k];
            k++;
        }
        break;
    }
    default: return 0; /* one scale and offset */
    }
    if (json_floats(scales, x->n_params, &x->scales) || json_ints(offsets, x->n_params, &x->offsets))
        return snprintf(why, wn, "tensor %s: %s needs %u scales and offsets", x->name, encodings[x->encoding], x->n_params), -1;
    x->pairs = calloc(x->n_params, sizeof *x->pairs);
    for (uint32_t i = 0; i < x->n_params; i++) x->pairs[i] = (q_scale_offset){x->scales[i], x->offsets[i]};
    if (x->encoding == Q_ENC_BLOCKWISE_EXPANSION) {
        const cJSON *bpa = cJSON_GetObjectItem(e, "blocks_per_axis"), *bsb = cJSON_GetObjectItem(e, "block_scale_bitwidth");
        x->blocks_per_axis = cJSON_IsNumber(bpa) ? (uint32_t)bpa->valuedouble : 1;
        x->block_scale_bits = cJSON_IsNumber(bsb) ? (uint32_t)bsb->valuedouble : 4;
        x->block_scales = calloc((size_t)x->n_params * x->blocks_per_axis, 1);
        memset(x->block_scales, 1, (size_t)x->n_params * x->blocks_per_axis);
        x->expansion = (q_blockwise_expansion){x->axis, x->pairs, x->blocks_per_axis, x->block_scale_bits, 0, {.s8 = x->block_scales}};
    }
    if (x->encoding == Q_ENC_VECTOR)
        x->vector = (q_vector){{x->bitwidth, x->axis, x->n_params, x->scales, x->offsets}, 1, 1, 0, 1, 8};
    return 0;
}

static int parse_tensors(const cJSON *a, stub_tensor *t, int *n, char *why, size_t wn) {
    *n = 0;
    if (!cJSON_IsArray(a)) return snprintf(why, wn, "inputs and outputs must be arrays"), -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (*n >= MA_SESSION_MAX_IO) return snprintf(why, wn, "more than %d tensors", MA_SESSION_MAX_IO), -1;
        stub_tensor *x = &t[(*n)++];
        memset(x, 0, sizeof *x);
        const cJSON *nm = cJSON_GetObjectItem(e, "name"), *dims = cJSON_GetObjectItem(e, "dims"), *dt = cJSON_GetObjectItem(e, "dtype");
        if (!cJSON_IsString(nm) || !cJSON_IsArray(dims) || !cJSON_IsString(dt))
            return snprintf(why, wn, "a tensor lacks name, dims or dtype"), -1;
        snprintf(x->name, sizeof x->name, "%s", nm->valuestring);
        const cJSON *d;
        cJSON_ArrayForEach(d, dims) {
            if (x->rank >= MA_MAX_DIMS) return snprintf(why, wn, "tensor %s: too many dimensions", x->name), -1;
            x->dims[x->rank++] = (uint32_t)d->valuedouble;
        }
        if (!(x->dtype = dtype_of(dt->valuestring))) return snprintf(why, wn, "tensor %s: unknown dtype %s", x->name, dt->valuestring), -1;
        if (parse_quant(e, x, why, wn)) return -1;
    }
    return 0;
}

static int parse_graph(const cJSON *j, stub_graph *g, char *why, size_t wn) {
    const cJSON *gn = cJSON_GetObjectItem(j, "graph"), *se = cJSON_GetObjectItem(j, "session");
    if (!cJSON_IsString(gn) || !cJSON_IsString(se)) return snprintf(why, wn, "a graph lacks its name or session"), -1;
    snprintf(g->name, sizeof g->name, "%s", gn->valuestring);
    snprintf(g->session, sizeof g->session, "%s", se->valuestring);
    if (parse_tensors(cJSON_GetObjectItem(j, "inputs"), g->in, &g->n_in, why, wn) ||
        parse_tensors(cJSON_GetObjectItem(j, "outputs"), g->out, &g->n_out, why, wn))
        return -1;
    return 0;
}

static int parse_file(const void *buf, uint64_t size, stub_file *f, char *why, size_t wn) {
    memset(f, 0, sizeof *f);
    if (!buf || size < strlen(MAGIC) || memcmp(buf, MAGIC, strlen(MAGIC))) return snprintf(why, wn, "not a stand-in context binary"), -1;
    cJSON *j = cJSON_ParseWithLength((const char *)buf + strlen(MAGIC), (size_t)size - strlen(MAGIC));
    if (!j) return snprintf(why, wn, "its JSON does not parse"), -1;
    int rc = -1;
    const cJSON *mo = cJSON_GetObjectItem(j, "model"), *graphs = cJSON_GetObjectItem(j, "graphs"), *soc = cJSON_GetObjectItem(j, "soc_model");
    if (!cJSON_IsString(mo)) {
        snprintf(why, wn, "no model directory");
        goto out;
    }
    snprintf(f->model, sizeof f->model, "%s", mo->valuestring);
    f->soc_model = cJSON_IsNumber(soc) ? (uint32_t)soc->valuedouble : 0;
    if (cJSON_IsArray(graphs)) {
        int n = cJSON_GetArraySize(graphs);
        if (n < 1) {
            snprintf(why, wn, "no graphs");
            goto out;
        }
        f->graphs = calloc((size_t)n, sizeof *f->graphs);
        const cJSON *g;
        cJSON_ArrayForEach(g, graphs) {
            if (parse_graph(g, &f->graphs[f->n_graphs++], why, wn)) goto out;
        }
    } else {
        f->graphs = calloc(1, sizeof *f->graphs);
        f->n_graphs = 1;
        if (parse_graph(j, &f->graphs[0], why, wn)) goto out;
    }
    for (int a = 0; a < f->n_graphs; a++)
        for (int b = 0; b < a; b++)
            if (!strcmp(f->graphs[a].name, f->graphs[b].name)) {
                snprintf(why, wn, "two graphs named %s", f->graphs[a].name);
                goto out;
            }
    rc = 0;
out:
    cJSON_Delete(j);
    if (rc) free_file(f);
    return rc;
}

/* a graph tensor's descriptor, as the system library hands it out */
static void fill_desc(q_tensor *q, const stub_tensor *t, uint32_t type, uint32_t id) {
    memset(q, 0, sizeof *q);
    q->version = tensor_version;
    q_tensor_v1 *v = &q->u.v1;
    v->id = id;
    v->name = t->name;
    v->type = type;
    v->format = 0; /* dense */
    v->dtype = t->dtype;
    v->quant.definition = Q_UNDEFINED;
    v->quant.encoding = Q_UNDEFINED;
    if (t->encoding != ENC_NONE) {
        v->quant.definition = Q_DEF_DEFINED;
        v->quant.encoding = (uint32_t)t->encoding;
        switch (t->encoding) {
        case Q_ENC_SCALE_OFFSET: v->quant.u.so = (q_scale_offset){t->scale, t->offset}; break;
        case Q_ENC_BW_SCALE_OFFSET: v->quant.u.bw = (q_bw_scale_offset){t->bitwidth, t->scale, t->offset}; break;
        case Q_ENC_AXIS_SCALE_OFFSET: v->quant.u.axis = (q_axis_scale_offset){t->axis, t->n_params, t->pairs}; break;
        case Q_ENC_BW_AXIS_SCALE_OFFSET:
            v->quant.u.bw_axis = (q_bw_axis_scale_offset){t->bitwidth, t->axis, t->n_params, t->scales, t->offsets};
            break;
        case Q_ENC_BLOCK: v->quant.u.block = (q_block){(uint32_t *)t->block_size, t->pairs}; break;
        case Q_ENC_BLOCKWISE_EXPANSION: v->quant.u.expansion = (q_blockwise_expansion *)&t->expansion; break;
        case Q_ENC_VECTOR: v->quant.u.vector = (q_vector *)&t->vector; break;
        }
    }
    v->rank = t->rank;
    v->dims = (uint32_t *)t->dims;
    v->mem_type = Q_MEM_RAW;
    if (q->version == 2) q->u.v2.sparse.layout = Q_UNDEFINED;
}

/* ================================================================== the system interface */

typedef struct sys_ctx {
    struct sys_ctx *next;
    stub_file file;
    q_tensor *tensors;
    unsigned char *graphs; /* n_graphs records of P.graph_info_size bytes */
    q_binary_info info;
    char build_id[64];
} sys_ctx;

static sys_ctx *sys_live;

static bool sys_valid(const sys_ctx *s) {
    pthread_mutex_lock(&lock);
    const sys_ctx *p = sys_live;
    while (p && p != s) p = p->next;
    pthread_mutex_unlock(&lock);
    return s && p == s;
}

static void sys_release(sys_ctx *s) {
    free_file(&s->file);
    free(s->tensors);
    free(s->graphs);
    s->tensors = NULL, s->graphs = NULL;
}

static q_status sys_create(q_handle *out) {
    setup();
    trace("systemContextCreate");
    if (!out) return fail(E_SYS_INVALID_ARGUMENT, "systemContextCreate: no handle to fill");
    sys_ctx *s = calloc(1, sizeof *s);
    if (!s) return fail(E_MEM_ALLOC, "out of memory");
    pthread_mutex_lock(&lock);
    s->next = sys_live;
    sys_live = s;
    pthread_mutex_unlock(&lock);
    *out = s;
    return E_OK;
}

static q_status describe(sys_ctx *s, const void *buf, uint64_t size, const q_binary_info **info) {
    char why[256];
    if (!sys_valid(s)) return fail(E_SYS_INVALID_HANDLE, "not a live system context handle");
    if (!buf || !size || !info) return fail(E_SYS_INVALID_ARGUMENT, "binary buffer, its size and the info pointer are required");
    sys_release(s);
    if (parse_file(buf, size, &s->file, why, sizeof why)) return fail(E_SYS_MALFORMED_BINARY, "malformed context binary: %s", why);
    int n_t = 0;
    for (int g = 0; g < s->file.n_graphs; g++) n_t += s->file.graphs[g].n_in + s->file.graphs[g].n_out;
    s->tensors = calloc(n_t > 0 ? (size_t)n_t + 1 : 1, sizeof *s->tensors);
    s->graphs = calloc(s->file.n_graphs > 0 ? (size_t)s->file.n_graphs : 1, P.graph_info_size);
    if (!s->tensors || !s->graphs) return fail(E_MEM_ALLOC, "out of memory");
    q_tensor *t = s->tensors;
    for (int g = 0; g < s->file.n_graphs; g++) {
        const stub_graph *sg = &s->file.graphs[g];
        q_graph_v3 body;
        memset(&body, 0, sizeof body);
        body.v2.v1.name = sg->name;
        body.v2.v1.n_in = (uint32_t)sg->n_in;
        body.v2.v1.in = t;
        for (int i = 0; i < sg->n_in; i++) fill_desc(t++, &sg->in[i], Q_TENSOR_APP_WRITE, (uint32_t)(g * 100 + i + 1));
        body.v2.v1.n_out = (uint32_t)sg->n_out;
        body.v2.v1.out = t;
        for (int i = 0; i < sg->n_out; i++) fill_desc(t++, &sg->out[i], Q_TENSOR_APP_READ, (uint32_t)(g * 100 + 50 + i + 1));
        body.first_op = 0;
        body.last_op = 0;
        unsigned char *rec = s->graphs + (size_t)g * P.graph_info_size;
        uint32_t version = ginfo_version;
        memcpy(rec, &version, sizeof version);
        size_t body_size = version == 3 ? sizeof(q_graph_v3) : version == 2 ? sizeof(q_graph_v2) : sizeof(q_graph_v1);
        memcpy(rec + Q_GRAPH_BODY, &body, body_size);
    }
    snprintf(s->build_id, sizeof s->build_id, "v%s.molmoact-stub", *P.sdk ? P.sdk : "2.x");
    q_binary_info *bi = &s->info;
    memset(bi, 0, sizeof *bi);
    bi->version = binfo_version;
    const q_version core = {P.major, P.minor, 0};
    if (binfo_version == 3) {
        q_binary_v3 *v = &bi->u.v3;
        v->backend_id = Q_BACKEND_HTP;
        v->build_id = s->build_id;
        v->core_api = core;
        v->backend_api = P.htp_api;
        v->soc = "";
        v->blob_version = (q_version){3, 3, 0};
        v->blob_size = size;
        v->n_graphs = (uint32_t)s->file.n_graphs;
        v->graphs = s->graphs;
        v->soc_model = s->file.soc_model;
    } else {
        q_binary_v1 *v = binfo_version == 2 ? &bi->u.v2.v1 : &bi->u.v1;
        v->backend_id = Q_BACKEND_HTP;
        v->build_id = s->build_id;
        v->core_api = core;
        v->backend_api = P.htp_api;
        v->soc = "";
        v->blob_version = (q_version){3, 1, 0};
        v->blob_size = size;
        v->n_graphs = (uint32_t)s->file.n_graphs;
        v->graphs = s->graphs;
    }
    *info = bi;
    return E_OK;
}

/* what holds address p: the file a mapping maps, "[heap]", "anonymous", or "unknown" */
static void mapping_of(const void *p, char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, ino;
        int at = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %lu %n", &lo, &hi, &ino, &at) < 3) continue;
        if ((uintptr_t)p < lo || (uintptr_t)p >= hi) continue;
        char *name = line + at;
        name[strcspn(name, "\n")] = 0;
        snprintf(out, cap, "%s", *name ? name : "anonymous");
        break;
    }
    fclose(f);
}

static q_status sys_binary_info(q_handle h, void *buf, uint64_t size, const q_binary_info **info, uint64_t *info_size) {
    char what[1024];
    mapping_of(buf, what, sizeof what);
    trace("systemContextGetBinaryInfo buffer=%s", what);
    q_status rc = describe(h, buf, size, info);
    if (rc == E_OK && info_size) *info_size = sizeof(q_binary_info);
    /* the buffer is the library's to write (the info does not point into it here): the first
     * byte of the magic changes, so these bytes are no longer a context binary */
    if (rc == E_OK) ((unsigned char *)buf)[0] ^= 0x20;
    return rc;
}

static q_status sys_metadata(q_handle h, const void *buf, uint64_t size, const q_binary_info **info) {
    const char *f = fault(NULL);
    if (f && !strcmp(f, "metadata_fail")) {
        trace("systemContextGetMetadata refused (stub fault)");
        return fail(E_SYS_OPERATION_FAILED, "getMetadata: this binary's metadata cannot be read (stub fault)");
    }
    trace("systemContextGetMetadata");
    return describe(h, buf, size, info);
}

static q_status sys_free(q_handle h) {
    sys_ctx *s = h;
    if (!sys_valid(s)) return fail(E_SYS_INVALID_HANDLE, "not a live system context handle");
    trace("systemContextFree");
    pthread_mutex_lock(&lock);
    sys_ctx **pp = &sys_live;
    while (*pp != s) pp = &(*pp)->next;
    *pp = s->next;
    pthread_mutex_unlock(&lock);
    sys_release(s);
    free(s);
    return E_OK;
}

/* ================================================================== the core interface: handles */

typedef struct { int tag; } handle_tag;
static handle_tag log_tag, backend_tag, device_tag;
static int logs_live, backends_live, devices_live;
static int handles_live; /* log + backend + device + contexts: 0 after teardown */
static bool dsp_gone;    /* dsp_restart_fatal: every context lost until backendFree */

static void emit(q_log_cb cb, uint32_t level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void emit(q_log_cb cb, uint32_t level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cb(fmt, level, now_us(), ap);
    va_end(ap);
}

static q_status log_create(q_log_cb cb, uint32_t level, q_handle *out) {
    setup();
    trace("logCreate level=%u", level);
    if (!out) return fail(E_LOG_INVALID_ARGUMENT, "logCreate: no handle to fill");
    if (level < Q_LOG_ERROR || level > Q_LOG_DEBUG) return fail(E_LOG_INVALID_ARGUMENT, "logCreate: log level %u is not 1..5", level);
    if (cb) /* as the HTP library greets at creation: a printf format and its arguments */
        emit(cb, level >= Q_LOG_WARN ? Q_LOG_WARN : Q_LOG_ERROR, " <W> Initializing HtpProvider (%s QAIRT %s, core API %u.%u.%u, HTP API %u.%u.%u)\n",
             "molmoact stand-in", *P.sdk ? P.sdk : "2.x", P.major, P.minor, 0u, P.htp_api.major, P.htp_api.minor, P.htp_api.patch);
    __atomic_add_fetch(&logs_live, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&handles_live, 1, __ATOMIC_SEQ_CST);
    *out = &log_tag;
    return E_OK;
}

static q_status log_set_level(q_handle log, uint32_t level) {
    if (log != &log_tag || !logs_live) return fail(E_LOG_INVALID_HANDLE, "not a live log handle");
    if (level < Q_LOG_ERROR || level > Q_LOG_DEBUG) return fail(E_LOG_INVALID_ARGUMENT, "log level %u is not 1..5", level);
    trace("logSetLogLevel %u", level);
    return E_OK;
}

static q_status log_free(q_handle log) {
    if (log != &log_tag || !logs_live) return fail(E_LOG_INVALID_HANDLE, "not a live log handle");
    trace("logFree");
    __atomic_sub_fetch(&logs_live, 1, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&handles_live, 1, __ATOMIC_SEQ_CST);
    return E_OK;
}

static q_status backend_create(q_handle log, const void **cfg, q_handle *b) {
    const char *adsp = getenv("ADSP_LIBRARY_PATH"), *dsp = getenv("DSP_LIBRARY_PATH");
    trace("backendCreate log=%s adsp=%s dsp=%s", log ? "yes" : "no", adsp ? adsp : "(unset)", dsp ? dsp : "(unset)");
    if (log && (log != &log_tag || !logs_live)) return fail(E_BACKEND_INVALID_HANDLE, "backendCreate: not a live log handle");
    if (!b) return fail(E_BACKEND_INVALID_ARGUMENT, "backendCreate: no handle to fill");
    (void)cfg;
    __atomic_add_fetch(&backends_live, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&handles_live, 1, __ATOMIC_SEQ_CST);
    dsp_gone = false;
    *b = &backend_tag;
    return E_OK;
}

static q_status backend_free(q_handle b) {
    if (b != &backend_tag || !backends_live) return fail(E_BACKEND_INVALID_HANDLE, "not a live backend handle");
    trace("backendFree");
    __atomic_sub_fetch(&backends_live, 1, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&handles_live, 1, __ATOMIC_SEQ_CST);
    return E_OK;
}

static q_status backend_api_version(q_api_version *v) {
    setup();
    if (!v) return fail(E_BACKEND_INVALID_ARGUMENT, "backendGetApiVersion: no version to fill");
    *v = (q_api_version){{P.major, P.minor, 0}, P.htp_api};
    return E_OK;
}

static q_status backend_build_id(const char **id) {
    static char build[64];
    if (!id) return fail(E_BACKEND_INVALID_ARGUMENT, "backendGetBuildId: no pointer to fill");
    snprintf(build, sizeof build, "v%s.molmoact-stub", *P.sdk ? P.sdk : "2.x");
    *id = build;
    return E_OK;
}

static q_status property_has_capability(uint32_t key) {
    (void)key;
    return status_of(E_NOT_SUPPORTED); /* QNN_PROPERTY_NOT_SUPPORTED for every key */
}

static q_status device_create(q_handle log, const q_device_config *const *cfg, q_handle *d) {
    char what[160] = "";
    for (int i = 0; cfg && cfg[i]; i++) {
        size_t l = strlen(what);
        if (cfg[i]->option == Q_DEVICE_CONFIG_PLATFORM_INFO) {
            snprintf(what + l, sizeof what - l, " platform_info");
            continue;
        }
        if (cfg[i]->option != Q_DEVICE_CONFIG_CUSTOM || !cfg[i]->u.custom) {
            trace("deviceCreate%s refused: config %d has option %u", what, i, cfg[i]->option);
            return fail(E_DEVICE_INVALID_CONFIG, "device config %d: option %u (0 custom, 1 platform info) or no custom config", i, cfg[i]->option);
        }
        /* read as the impersonated library would: in the layout of its HTP API version */
        q_htp_device_config hc;
        if (P.htp_api.major > 5 || (P.htp_api.major == 5 && P.htp_api.minor >= 48)) {
            const q_htp_device_config_548 *w = cfg[i]->u.custom;
            hc.option = w->option;
            memcpy(&hc.u, &w->u, sizeof hc.u);
        } else {
            hc = *(const q_htp_device_config *)cfg[i]->u.custom;
        }
        const q_htp_device_config *h = &hc;
        switch (h->option) {
        case Q_HTP_CONFIG_SOC: snprintf(what + l, sizeof what - l, " soc=%u", h->u.soc_model); break;
        case Q_HTP_CONFIG_ARCH: {
            static const uint32_t archs[] = {68, 69, 73, 75, 79, 81, 85};
            bool known = false;
            for (size_t k = 0; k < COUNT(archs); k++) known |= h->u.arch.arch == archs[k];
            if (h->u.arch.device_id != 0 || !known) {
                trace("deviceCreate%s refused: arch config device %u arch %u", what, h->u.arch.device_id, h->u.arch.arch);
                return fail(E_DEVICE_INVALID_CONFIG, "HTP arch config: device %u, arch %u (a device id, then the arch: 68, 69, 73, 75, 79, 81, 85)",
                            h->u.arch.device_id, h->u.arch.arch);
            }
            snprintf(what + l, sizeof what - l, " arch=%u", h->u.arch.arch);
            break;
        }
        case Q_HTP_CONFIG_SIGNEDPD: snprintf(what + l, sizeof what - l, " signed_pd=%d", (int)h->u.pd.on); break;
        case Q_HTP_CONFIG_SECUREPD: snprintf(what + l, sizeof what - l, " secure_pd=%d", (int)h->u.pd.on); break;
        default:
            trace("deviceCreate%s refused: HTP config option %u", what, h->option);
            return fail(E_DEVICE_INVALID_CONFIG, "HTP device config option %u is not soc (0), arch (1), signed pd (2) or secure pd (3)", h->option);
        }
    }
    trace("deviceCreate%s", what);
    if (log && (log != &log_tag || !logs_live)) return fail(E_DEVICE_INVALID_HANDLE, "deviceCreate: not a live log handle");
    if (!d) return fail(E_INVALID_ARGUMENT, "deviceCreate: no handle to fill");
    __atomic_add_fetch(&devices_live, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&handles_live, 1, __ATOMIC_SEQ_CST);
    *d = &device_tag;
    return E_OK;
}

static q_status device_free(q_handle d) {
    if (d != &device_tag || !devices_live) return fail(E_DEVICE_INVALID_HANDLE, "not a live device handle");
    __atomic_sub_fetch(&devices_live, 1, __ATOMIC_SEQ_CST);
    trace("deviceFree live=%d", __atomic_sub_fetch(&handles_live, 1, __ATOMIC_SEQ_CST));
    return E_OK;
}

/* ================================================================== HTP perf infrastructure */

#define MAX_POWER_IDS 64
static struct { uint32_t id; int state; /* 1 live, 2 destroyed */ } power_ids[MAX_POWER_IDS];
static uint32_t next_power_id = 1;

static int power_state(uint32_t id) {
    for (int i = 0; i < MAX_POWER_IDS; i++)
        if (power_ids[i].state && power_ids[i].id == id) return power_ids[i].state;
    return 0;
}

static q_status perf_create_id(uint32_t device_id, uint32_t core_id, uint32_t *id) {
    const char *f = fault(NULL);
    if (f && !strcmp(f, "vote_id_fail")) {
        trace("createPowerConfigId device=%u core=%u refused (stub fault)", device_id, core_id);
        return fail(E_PERF_FAILED, "createPowerConfigId: the DSP's power manager refused (stub fault)");
    }
    if (!id) {
        trace("createPowerConfigId device=%u core=%u refused: no id to fill", device_id, core_id);
        return fail(E_PERF_INVALID_HANDLE_PTR, "createPowerConfigId: no id to fill");
    }
    if (device_id != 0 || core_id != 0) {
        trace("createPowerConfigId device=%u core=%u refused: one device, one core", device_id, core_id);
        return fail(E_PERF_INVALID_INPUT, "createPowerConfigId: device %u core %u (the stand-in has device 0, core 0)", device_id, core_id);
    }
    pthread_mutex_lock(&lock);
    int slot = -1;
    for (int i = 0; i < MAX_POWER_IDS && slot < 0; i++)
        if (!power_ids[i].state) slot = i;
    if (slot >= 0) power_ids[slot].id = next_power_id++, power_ids[slot].state = 1;
    pthread_mutex_unlock(&lock);
    if (slot < 0) return fail(E_PERF_MEM_ALLOC, "createPowerConfigId: too many ids");
    *id = power_ids[slot].id;
    trace("createPowerConfigId device=%u core=%u id=%u%s", device_id, core_id, *id, devices_live ? "" : " (no live device)");
    return E_OK;
}

static q_status perf_destroy_id(uint32_t id) {
    pthread_mutex_lock(&lock);
    int found = 0;
    for (int i = 0; i < MAX_POWER_IDS; i++)
        if (power_ids[i].state == 1 && power_ids[i].id == id) power_ids[i].state = 2, found = 1;
    pthread_mutex_unlock(&lock);
    if (!found) {
        trace("destroyPowerConfigId id=%u refused: %s", id, power_state(id) == 2 ? "already destroyed" : "never created");
        return fail(E_PERF_INVALID_INPUT, "destroyPowerConfigId: power config id %u is %s", id, power_state(id) == 2 ? "already destroyed" : "unknown");
    }
    trace("destroyPowerConfigId id=%u", id);
    return E_OK;
}

static bool corner_ok(uint32_t c) {
    static const uint32_t corners[] = {0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0x92, 0x93, 0x94, 0x95, 0xa0};
    for (size_t i = 0; i < COUNT(corners); i++)
        if (c == corners[i]) return true;
    return false;
}

/* why a DCVS v3 vote is refused, or NULL */
static const char *dcvs_problem(uint32_t id, const q_dcvs_v3 *d) {
    static _Thread_local char why[160];
    if (d->context_id != id) return snprintf(why, sizeof why, "dcvs_v3 contextId %u is not the power config id %u", d->context_id, id), why;
    if (d->set_dcvs_enable > 1 || d->dcvs_enable > 1 || d->set_sleep_latency > 1 || d->set_sleep_disable > 1 || d->set_bus_params > 1 ||
        d->set_core_params > 1)
        return "dcvs_v3 set* / dcvsEnable flags are not 0 or 1";
    if (d->power_mode != 0x1 && d->power_mode != 0x2 && d->power_mode != 0x4 && d->power_mode != 0x8 && d->power_mode != 0x10 &&
        d->power_mode != 0x20)
        return snprintf(why, sizeof why, "dcvs_v3 powerMode 0x%x is not a power mode", d->power_mode), why;
    if (d->set_sleep_latency && (d->sleep_latency < 10 || d->sleep_latency > 65535))
        return snprintf(why, sizeof why, "dcvs_v3 sleepLatency %u us is outside 10-65535", d->sleep_latency), why;
    if (d->set_bus_params && (!corner_ok(d->bus_min) || !corner_ok(d->bus_target) || !corner_ok(d->bus_max) ||
                              d->bus_min > d->bus_target || d->bus_target > d->bus_max))
        return snprintf(why, sizeof why, "dcvs_v3 bus corners 0x%x/0x%x/0x%x are not min <= target <= max voltage corners", d->bus_min,
                        d->bus_target, d->bus_max), why;
    if (d->set_core_params && (!corner_ok(d->core_min) || !corner_ok(d->core_target) || !corner_ok(d->core_max) ||
                               d->core_min > d->core_target || d->core_target > d->core_max))
        return snprintf(why, sizeof why, "dcvs_v3 core corners 0x%x/0x%x/0x%x are not min <= target <= max voltage corners", d->core_min,
                        d->core_target, d->core_max), why;
    return NULL;
}

static q_status perf_set_power(uint32_t id, const q_power_config **list) {
    const char *f = fault(NULL);
    if (f && !strcmp(f, "vote_fail")) {
        trace("setPowerConfig id=%u refused (stub fault)", id);
        return fail(E_PERF_TRANSPORT, "setPowerConfig: the vote did not reach the DSP (stub fault)");
    }
    int st = power_state(id);
    if (st != 1) {
        trace("setPowerConfig id=%u refused: %s", id, st == 2 ? "destroyed" : "never created");
        return fail(E_PERF_INVALID_INPUT, "setPowerConfig: power config id %u is %s", id, st == 2 ? "destroyed" : "unknown");
    }
    int n = 0;
    while (list && n < 32 && list[n]) n++;
    if (!list || !n || n == 32) {
        trace("setPowerConfig id=%u refused: %s", id, !list ? "no list" : !n ? "empty list" : "list not NULL-terminated");
        return fail(E_PERF_INVALID_INPUT, "setPowerConfig: a NULL-terminated list of one or more configs is required");
    }
    for (int i = 0; i < n; i++) { /* validate all before logging any */
        const q_power_config *c = list[i];
        const char *why = NULL;
        if (c->option == Q_POWER_DCVS_V3) why = dcvs_problem(id, &c->u.dcvs_v3);
        else if (c->option == Q_POWER_RPC_POLLING_TIME && c->u.rpc_polling_time > 9999) why = "rpc polling time above 9999 us";
        else if (c->option < Q_POWER_DCVS_V3 || c->option > Q_POWER_DDR_PERF_MODE ||
                 (c->option == Q_POWER_ADAPTIVE_POLLING && P.minor < 27) || (c->option == Q_POWER_DDR_PERF_MODE && P.minor < 30)) {
            trace("setPowerConfig id=%u refused: option %u", id, c->option);
            return fail(E_PERF_UNSUPPORTED_CONFIG, "setPowerConfig: option %u is not one this SDK has", c->option);
        }
        if (why) {
            trace("setPowerConfig id=%u refused: %s", id, why);
            return fail(E_PERF_INVALID_INPUT, "setPowerConfig: %s", why);
        }
    }
    for (int i = 0; i < n; i++) {
        const q_power_config *c = list[i];
        const q_dcvs_v3 *d = &c->u.dcvs_v3;
        switch (c->option) {
        case Q_POWER_DCVS_V3:
            trace("setPowerConfig id=%u dcvs_v3 context=%u set_dcvs=%u dcvs=%u power_mode=0x%x set_sleep_latency=%u sleep_latency=%u "
                  "set_sleep_disable=%u sleep_disable=%u set_bus=%u bus=0x%x/0x%x/0x%x set_core=%u core=0x%x/0x%x/0x%x",
                  id, d->context_id, d->set_dcvs_enable, d->dcvs_enable, d->power_mode, d->set_sleep_latency, d->sleep_latency,
                  d->set_sleep_disable, d->sleep_disable, d->set_bus_params, d->bus_min, d->bus_target, d->bus_max,
                  d->set_core_params, d->core_min, d->core_target, d->core_max);
            break;
        case Q_POWER_RPC_CONTROL_LATENCY: trace("setPowerConfig id=%u rpc_control_latency=%u", id, c->u.rpc_control_latency); break;
        case Q_POWER_RPC_POLLING_TIME: trace("setPowerConfig id=%u rpc_polling_time=%u", id, c->u.rpc_polling_time); break;
        case Q_POWER_HMX_TIMEOUT: trace("setPowerConfig id=%u hmx_timeout_us=%u", id, c->u.hmx_timeout_us); break;
        case Q_POWER_HMX_V2:
            trace("setPowerConfig id=%u hmx_v2 pick_default=%u corners=0x%x/0x%x/0x%x perf_mode=%u", id, c->u.hmx_v2.pick_default,
                  c->u.hmx_v2.corner_min, c->u.hmx_v2.corner_target, c->u.hmx_v2.corner_max, c->u.hmx_v2.perf_mode);
            break;
        case Q_POWER_ADAPTIVE_POLLING: trace("setPowerConfig id=%u adaptive_polling_time=%u", id, c->u.adaptive_polling_time); break;
        default: trace("setPowerConfig id=%u ddr_perf_mode=%u", id, c->u.ddr_perf_mode); break;
        }
    }
    return E_OK;
}

static q_status perf_set_memory(uint32_t device_id, uint32_t core_id, const q_memory_config **list) {
    if (device_id != 0 || core_id != 0 || !list || !list[0]) {
        trace("setMemoryConfig device=%u core=%u refused", device_id, core_id);
        return fail(E_PERF_INVALID_INPUT, "setMemoryConfig: device 0, core 0 and a NULL-terminated list are required");
    }
    for (int i = 0; list[i] && i < 32; i++) {
        if (list[i]->option != 1) return fail(E_PERF_UNSUPPORTED_CONFIG, "setMemoryConfig: option %u (1 is grow size)", list[i]->option);
        trace("setMemoryConfig device=%u core=%u grow_size=%u", device_id, core_id, list[i]->u.grow_size);
    }
    return E_OK;
}

static const q_htp_infra htp_infra = {Q_INFRA_PERF, {{perf_create_id, perf_destroy_id, perf_set_power, perf_set_memory}}};

static q_status device_infrastructure(const q_htp_infra **out) {
    trace("deviceGetInfrastructure");
    if (!out) return fail(E_INVALID_ARGUMENT, "deviceGetInfrastructure: no pointer to fill");
    *out = &htp_infra;
    return E_OK;
}

/* ================================================================== contexts and graphs */

typedef struct stub_ctx stub_ctx;
typedef struct run_graph {
    const stub_graph *g;
    stub_ctx *ctx;
    ma_session *sess;
} run_graph;

struct stub_ctx {
    stub_ctx *next;
    stub_file file;
    ma_model model;
    bool model_open;
    run_graph *graphs;
    ma_session *sessions[8];
    int n_sessions;
    unsigned dead; /* the error every execute gets after a subsystem restart */
    char names[256];
};

static stub_ctx *ctx_live;
static bool restart_seen, retrieve_failed; /* dsp_restart_retrieve: a restart fired in this process; the retrieve after it failed */

typedef struct mem_reg {
    struct mem_reg *next;
    stub_ctx *ctx;
    dev_t dev;
    ino_t ino;
    uint64_t offset;
    void *map;
    size_t map_len;
    unsigned char *ptr;
    size_t bytes;
    uint32_t dtype, rank, dims[MA_MAX_DIMS];
} mem_reg;

static mem_reg *mem_live;

static bool ctx_valid(const stub_ctx *c) {
    pthread_mutex_lock(&lock);
    const stub_ctx *p = ctx_live;
    while (p && p != c) p = p->next;
    pthread_mutex_unlock(&lock);
    return c && p == c;
}

static run_graph *graph_of(q_handle h) {
    run_graph *found = NULL;
    pthread_mutex_lock(&lock);
    for (stub_ctx *c = ctx_live; c && !found; c = c->next)
        for (int i = 0; i < c->file.n_graphs; i++)
            if (&c->graphs[i] == h) found = h;
    pthread_mutex_unlock(&lock);
    return found;
}

static const unsigned session_parts[7] = {MA_PART_VISION, MA_PART_LLM(0), MA_PART_LLM(1), MA_PART_LLM(2), MA_PART_LLM(3),
                                          MA_PART_ACTION_CONTEXT, MA_PART_ACTION_STEP};
static int session_slot(const char *name) {
    for (int i = 0; i < 7; i++)
        if (!strcmp(MA_SESSION_NAMES[i], name)) return i;
    return -1;
}

static void ctx_destroy(stub_ctx *c) {
    for (int i = 0; i < c->n_sessions; i++) ma_session_close(c->sessions[i]);
    if (c->model_open) ma_model_close(&c->model);
    free(c->graphs);
    free_file(&c->file);
    free(c);
}

static q_status context_create(q_handle backend, q_handle device, const void **cfg, const void *buf, uint64_t size, q_handle *out,
                               q_handle profile) {
    (void)cfg, (void)profile;
    char why[256];
    if (backend != &backend_tag || !backends_live) return fail(E_CTX_INVALID_HANDLE, "contextCreateFromBinary: not a live backend handle");
    if (device && (device != &device_tag || !devices_live)) return fail(E_CTX_INVALID_HANDLE, "contextCreateFromBinary: not a live device handle");
    if (!buf || !size || !out) return fail(E_CTX_INVALID_ARGUMENT, "contextCreateFromBinary: binary, size and handle are required");
    stub_ctx *c = calloc(1, sizeof *c);
    if (!c) return fail(E_MEM_ALLOC, "out of memory");
    if (parse_file(buf, size, &c->file, why, sizeof why)) {
        free(c);
        return fail(E_CTX_CREATE_FROM_BINARY, "context binary is malformed: %s", why);
    }
    unsigned parts = 0;
    const char *rejected = NULL;
    for (int i = 0; i < c->file.n_graphs; i++) {
        const stub_graph *g = &c->file.graphs[i];
        bool listed = false;
        for (int k = 0; k < i; k++) listed |= !strcmp(c->file.graphs[k].session, g->session);
        size_t l = strlen(c->names);
        if (!listed) snprintf(c->names + l, sizeof c->names - l, "%s%s", l ? "," : "", g->session);
        const char *f = fault(g->session);
        if (f && !strcmp(f, "reject")) rejected = g->session;
        int slot = session_slot(g->session);
        if (slot >= 0) parts |= session_parts[slot];
    }
    trace("contextCreateFromBinary %s", c->names);
    if (rejected) {
        ctx_destroy(c);
        return fail(E_CTX_BINARY_CONFIGURATION, "context binary rejected: built for soc 99 (stub fault)");
    }
    if (dsp_gone) {
        ctx_destroy(c);
        return fail(E_SYSTEM_COMMUNICATION_FATAL, "the cDSP did not recover from a subsystem restart (stub fault)");
    }
    c->graphs = calloc(c->file.n_graphs > 0 ? (size_t)c->file.n_graphs : 1, sizeof *c->graphs);
    ma_error err = {0};
    /* this library's copy of the kernels runs on the calling thread only: helper threads would
     * outlive the library (dlclose unmaps their code and the futexes they wait on) */
    ma_threads_set(1);
    if (!c->graphs || ma_model_open_parts(c->file.model, "libero", parts, &c->model, &err)) {
        ctx_destroy(c);
        return fail(E_CTX_CREATE_FROM_BINARY, "cannot open the model behind the stub context: %s", err.msg);
    }
    c->model_open = true;
    for (int i = 0; i < c->file.n_graphs; i++) {
        const stub_graph *g = &c->file.graphs[i];
        ma_session *s = NULL;
        for (int k = 0; k < i && !s; k++)
            if (!strcmp(c->file.graphs[k].session, g->session)) s = c->graphs[k].sess;
        if (!s) {
            if (session_slot(g->session) < 0 || c->n_sessions >= (int)COUNT(c->sessions) ||
                ma_session_open(&ma_cpu_backend, &c->model, g->session, &s, &err)) {
                ctx_destroy(c);
                return fail(E_CTX_CREATE_FROM_BINARY, "cannot open session %s behind graph %s: %s", g->session, g->name,
                            session_slot(g->session) < 0 ? "no such session" : err.msg);
            }
            c->sessions[c->n_sessions++] = s;
        }
        c->graphs[i] = (run_graph){g, c, s};
    }
    pthread_mutex_lock(&lock);
    c->next = ctx_live;
    ctx_live = c;
    pthread_mutex_unlock(&lock);
    __atomic_add_fetch(&handles_live, 1, __ATOMIC_SEQ_CST);
    *out = c;
    return E_OK;
}

static void mem_unmap(mem_reg *m) {
    if (m->map) munmap(m->map, m->map_len);
    free(m);
}

static q_status context_free(q_handle h, q_handle profile) {
    (void)profile;
    stub_ctx *c = h;
    if (!ctx_valid(c)) return fail(E_CTX_INVALID_HANDLE, "contextFree: not a live context handle");
    trace("contextFree %s", c->names);
    int leaked = 0;
    pthread_mutex_lock(&lock);
    stub_ctx **pp = &ctx_live;
    while (*pp != c) pp = &(*pp)->next;
    *pp = c->next;
    for (mem_reg **mp = &mem_live; *mp;) {
        mem_reg *m = *mp;
        if (m->ctx == c) {
            *mp = m->next;
            mem_unmap(m);
            leaked++;
        } else {
            mp = &m->next;
        }
    }
    pthread_mutex_unlock(&lock);
    if (leaked) trace("contextFree %s: %d memory handles were still registered", c->names, leaked);
    ctx_destroy(c);
    __atomic_sub_fetch(&handles_live, 1, __ATOMIC_SEQ_CST);
    return E_OK;
}

static q_status graph_retrieve(q_handle h, const char *name, q_handle *out) {
    stub_ctx *c = h;
    trace("graphRetrieve %s", name ? name : "(null)");
    if (!ctx_valid(c)) return fail(E_GRAPH_INVALID_HANDLE, "graphRetrieve: not a live context handle");
    if (!name || !out) return fail(E_GRAPH_INVALID_NAME, "graphRetrieve: a graph name and a handle to fill are required");
    char held[256] = "";
    for (int i = 0; i < c->file.n_graphs; i++) {
        const stub_graph *g = &c->file.graphs[i];
        const char *f = fault(g->session);
        if (!strcmp(g->name, name)) {
            if (f && !strcmp(f, "no_graph")) return fail(E_GRAPH_DOES_NOT_EXIST, "graph %s is not in this context (stub fault)", name);
            if (f && !strcmp(f, "dsp_restart_retrieve") && restart_seen && !retrieve_failed) {
                retrieve_failed = true;
                trace("graphRetrieve %s refused after the restart (stub fault)", name);
                return fail(E_GRAPH_DOES_NOT_EXIST, "graph %s: not yet available after the subsystem restart (stub fault)", name);
            }
            *out = &c->graphs[i];
            return E_OK;
        }
        size_t l = strlen(held);
        snprintf(held + l, sizeof held - l, "%s%s", l ? ", " : "", g->name);
    }
    return fail(E_GRAPH_DOES_NOT_EXIST, "graph %s is not in this context (it holds %s)", name, held);
}

/* the quantization parameters of element e */
static void qparams(const stub_tensor *t, size_t e, double *scale, double *offset) {
    size_t ch = 0;
    switch (t->encoding) {
    case Q_ENC_AXIS_SCALE_OFFSET:
    case Q_ENC_BW_AXIS_SCALE_OFFSET: {
        size_t inner = 1;
        for (uint32_t k = (uint32_t)t->axis + 1; k < t->rank; k++) inner *= t->dims[k];
        ch = (e / inner) % t->dims[t->axis];
        break;
    }
    case Q_ENC_BLOCK: {
        size_t rest = e, idx = 0, mul = 1;
        for (int k = (int)t->rank - 1; k >= 0; k--) {
            size_t i = rest % t->dims[k];
            rest /= t->dims[k];
            idx += i / t->block_size[k] * mul;
            mul *= t->dims[k] / t->block_size[k];
        }
        ch = idx;
        break;
    }
    default: *scale = t->scale, *offset = t->offset; return;
    }
    *scale = t->scales[ch];
    *offset = t->offsets[ch];
}

static double get_val(const stub_tensor *t, const void *p, size_t i) {
    double s = 1, o = 0;
    if (t->encoding != ENC_NONE) qparams(t, i, &s, &o);
    switch (t->dtype) {
    case Q_DT_FLOAT_32: return ((const float *)p)[i];
    case Q_DT_FLOAT_16: return ma_f16_to_f32(((const uint16_t *)p)[i]);
    case Q_DT_UFIXED_16: return ((double)((const uint16_t *)p)[i] + o) * s;
    case Q_DT_UFIXED_8: return ((double)((const uint8_t *)p)[i] + o) * s;
    case Q_DT_SFIXED_16: return ((double)((const int16_t *)p)[i] + o) * s;
    case Q_DT_SFIXED_8: return ((double)((const int8_t *)p)[i] + o) * s;
    case Q_DT_BOOL_8:
    case Q_DT_UINT_8: return ((const uint8_t *)p)[i];
    case Q_DT_INT_8: return ((const int8_t *)p)[i];
    case Q_DT_INT_32: return ((const int32_t *)p)[i];
    default: return (double)((const int64_t *)p)[i];
    }
}

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

static void put_val(const stub_tensor *t, void *p, size_t i, double x) {
    double s = 1, o = 0;
    if (t->encoding != ENC_NONE) qparams(t, i, &s, &o);
    double q = t->encoding != ENC_NONE ? nearbyint(x / s) - o : x;
    switch (t->dtype) {
    case Q_DT_FLOAT_32: ((float *)p)[i] = (float)x; break;
    case Q_DT_FLOAT_16: ((uint16_t *)p)[i] = ma_f32_to_f16((float)x); break;
    case Q_DT_UFIXED_16: ((uint16_t *)p)[i] = (uint16_t)clampd(q, 0, 65535); break;
    case Q_DT_UFIXED_8: ((uint8_t *)p)[i] = (uint8_t)clampd(q, 0, 255); break;
    case Q_DT_SFIXED_16: ((int16_t *)p)[i] = (int16_t)clampd(q, -32768, 32767); break;
    case Q_DT_SFIXED_8: ((int8_t *)p)[i] = (int8_t)clampd(q, -128, 127); break;
    case Q_DT_BOOL_8:
    case Q_DT_UINT_8: ((uint8_t *)p)[i] = (uint8_t)x; break;
    case Q_DT_INT_8: ((int8_t *)p)[i] = (int8_t)x; break;
    case Q_DT_INT_32: ((int32_t *)p)[i] = (int32_t)x; break;
    default: ((int64_t *)p)[i] = (int64_t)x; break;
    }
}

/* the client's tensor for graph tensor d, by name: its data, checked against the descriptor */
static q_status bind_tensor(const run_graph *rg, const q_tensor *ts, uint32_t n, const stub_tensor *d, const char *what, unsigned char **data) {
    const q_tensor *t = NULL;
    for (uint32_t i = 0; i < n && !t; i++)
        if ((ts[i].version == 1 || ts[i].version == 2) && ts[i].u.v1.name && !strcmp(ts[i].u.v1.name, d->name)) t = &ts[i];
    if (!t) return fail(E_GRAPH_INVALID_TENSOR, "%s %s of graph %s is not among the tensors given", what, d->name, rg->g->name);
    const q_tensor_v1 *v = &t->u.v1;
    if (v->dtype != d->dtype || v->rank != d->rank)
        return fail(E_GRAPH_INVALID_TENSOR, "%s %s: type 0x%x rank %u where the graph has 0x%x rank %u", what, d->name, v->dtype, v->rank, d->dtype, d->rank);
    for (uint32_t k = 0; k < d->rank; k++)
        if (!v->dims || v->dims[k] != d->dims[k])
            return fail(E_GRAPH_INVALID_TENSOR, "%s %s: dimension %u differs from the graph's", what, d->name, k);
    size_t need = numel(d->dims, d->rank) * elem_bytes(d->dtype);
    if (v->mem_type == Q_MEM_RAW) {
        if (!v->buf.client.data || v->buf.client.size < need)
            return fail(E_GRAPH_INVALID_TENSOR, "%s %s: client buffer of %u bytes, %zu needed", what, d->name, v->buf.client.size, need);
        *data = v->buf.client.data;
        return E_OK;
    }
    if (v->mem_type != Q_MEM_HANDLE) return fail(E_GRAPH_INVALID_TENSOR, "%s %s: memory type %u", what, d->name, v->mem_type);
    const mem_reg *m = NULL;
    pthread_mutex_lock(&lock);
    for (const mem_reg *p = mem_live; p && !m; p = p->next)
        if ((const void *)p == v->buf.mem) m = p;
    pthread_mutex_unlock(&lock);
    if (!m) return fail(E_GRAPH_INVALID_TENSOR, "%s %s: memory handle %p is not registered", what, d->name, v->buf.mem);
    if (m->ctx != rg->ctx) return fail(E_GRAPH_INVALID_TENSOR, "%s %s: memory handle registered with another context", what, d->name);
    if (m->dtype != d->dtype || m->bytes < need)
        return fail(E_GRAPH_INVALID_TENSOR, "%s %s: registered memory of type 0x%x, %zu bytes; the tensor is 0x%x, %zu bytes", what, d->name,
                    m->dtype, m->bytes, d->dtype, need);
    *data = m->ptr;
    return E_OK;
}

static q_status graph_execute(q_handle h, const q_tensor *in, uint32_t n_in, q_tensor *out, uint32_t n_out, q_handle profile, q_handle signal) {
    (void)profile, (void)signal;
    run_graph *rg = graph_of(h);
    if (!rg) return fail(E_GRAPH_INVALID_HANDLE, "graphExecute: not a live graph handle");
    const stub_graph *g = rg->g;
    trace("graphExecute %s", g->session);
    const char *f = fault(g->session);
    if (f && !strcmp(f, "execute_error")) return fail(E_GENERAL, "graph execution failed on the device (stub fault)");
    if (f && !strcmp(f, "hang"))
        for (;;) pause();
    static bool crashed, restarted;
    if (f && (!strcmp(f, "crash") || (!strcmp(f, "crash_once") && fire_once(&crashed)))) raise(SIGSEGV);
    if (dsp_gone) return fail(E_SYSTEM_COMMUNICATION_FATAL, "the cDSP did not recover from a subsystem restart (stub fault)");
    if (rg->ctx->dead) return fail(rg->ctx->dead, "the context was lost in a subsystem restart: free it and create it again");
    if (f && (!strcmp(f, "dsp_restart") || !strcmp(f, "dsp_restart_retrieve")) && fire_once(&restarted)) {
        rg->ctx->dead = E_SYSTEM_COMMUNICATION;
        restart_seen = true;
        trace("graphExecute %s: subsystem restart", g->session);
        return fail(E_SYSTEM_COMMUNICATION, "subsystem restart of the cDSP during graph %s: its context is lost (stub fault)", g->name);
    }
    if (f && !strcmp(f, "dsp_restart_fatal") && fire_once(&restarted)) {
        dsp_gone = true;
        trace("graphExecute %s: fatal subsystem restart", g->session);
        unsigned code = P.has_ssr_fatal ? E_SYSTEM_COMMUNICATION_FATAL : E_SYSTEM_COMMUNICATION;
        return fail(code, "subsystem restart of the cDSP during graph %s, not recovered (stub fault)", g->name);
    }
    if (!in || !out || (int)n_in != g->n_in || (int)n_out != g->n_out)
        return fail(E_GRAPH_INVALID_ARGUMENT, "graph %s takes %d inputs and %d outputs, got %u and %u", g->name, g->n_in, g->n_out, n_in, n_out);
    for (int i = 0; i < g->n_in + g->n_out; i++) {
        const stub_tensor *d = i < g->n_in ? &g->in[i] : &g->out[i - g->n_in];
        if (d->encoding == Q_ENC_BLOCKWISE_EXPANSION || d->encoding == Q_ENC_VECTOR)
            return fail(E_NOT_SUPPORTED, "tensor %s: %s I/O is not emulated by the stand-in", d->name, encodings[d->encoding]);
    }
    ma_session *s = rg->sess;
    ma_tensor tin[MA_SESSION_MAX_IO], tout[MA_SESSION_MAX_IO];
    memset(tin, 0, sizeof tin);
    memset(tout, 0, sizeof tout);
    q_status rc = E_OK;
    ma_error err = {0};
    unsigned char *data;
    for (int i = 0; i < g->n_in && rc == E_OK; i++) {
        const stub_tensor *d = &g->in[i];
        if ((rc = bind_tensor(rg, in, n_in, d, "input", &data)) != E_OK) break;
        /* the session's input of that name (the graph's names are the session's here, or in order) */
        int k = ma_session_input_index(s, d->name);
        if (k < 0) k = i;
        int64_t shape[MA_MAX_DIMS];
        for (uint32_t r = 0; r < d->rank; r++) shape[r] = d->dims[r];
        if (ma_tensor_alloc(&tin[k], s->in[k].dtype, (int)d->rank, shape, &err)) {
            rc = fail(E_MEM_ALLOC, "out of memory");
            break;
        }
        const size_t n = (size_t)ma_tensor_numel(&tin[k]);
        for (size_t e = 0; e < n; e++) {
            const double x = get_val(d, data, e);
            switch (tin[k].dtype) {
            case MA_DT_F32: ((float *)tin[k].data)[e] = (float)x; break;
            case MA_DT_U8:
            case MA_DT_BOOL: ((uint8_t *)tin[k].data)[e] = (uint8_t)x; break;
            case MA_DT_I32: ((int32_t *)tin[k].data)[e] = (int32_t)x; break;
            default: ((int64_t *)tin[k].data)[e] = (int64_t)x; break;
            }
        }
    }
    if (rc == E_OK && ma_session_run(s, tin, tout, &err)) rc = fail(E_GENERAL, "execution failed: %s", err.msg);
    for (int i = 0; i < g->n_out && rc == E_OK; i++) {
        const stub_tensor *d = &g->out[i];
        if ((rc = bind_tensor(rg, out, n_out, d, "output", &data)) != E_OK) break;
        int k = ma_session_output_index(s, d->name);
        if (k < 0) k = i;
        const size_t n = (size_t)ma_tensor_numel(&tout[k]);
        for (size_t e = 0; e < n; e++) put_val(d, data, e, ((const float *)tout[k].data)[e]);
    }
    for (int i = 0; i < MA_SESSION_MAX_IO; i++) {
        ma_tensor_free(&tin[i]);
        ma_tensor_free(&tout[i]);
    }
    return rc;
}

/* ================================================================== registered memory */

/* an fd the stand-in libcdsprpc.so handed out (tests/qnn_stub/cdsprpc_stub.c names its memfds so) */
static bool rpcmem_fd(int fd) {
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return false;
    target[n] = 0;
    return !strncmp(target, "/memfd:ma-rpcmem", 16);
}

static q_status mem_register(q_handle h, const q_mem_desc *descs, uint32_t n, q_handle *handles) {
    stub_ctx *c = h;
    if (!ctx_valid(c)) return fail(E_MEM_INVALID_HANDLE, "memRegister: not a live context handle");
    if (!descs || !n || !handles) return fail(E_MEM_INVALID_ARGUMENT, "memRegister: descriptors, their count and handles are required");
    mem_reg **made = calloc(n, sizeof *made); /* handles are written only when every descriptor registered */
    if (!made) return fail(E_MEM_ALLOC, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        const q_mem_desc *d = &descs[i];
        const char *kind = d->mem_type == Q_MEMTYPE_ION ? "ion" : d->mem_type == Q_MEMTYPE_CUSTOM ? "custom" : "other";
        q_status rc = E_OK;
        mem_reg *m = calloc(1, sizeof *m);
        int fd = -1;
        uint64_t offset = 0, declared = 0;
        size_t need = 0;
        struct stat st;
        memset(&st, 0, sizeof st);
        if (!m) rc = fail(E_MEM_ALLOC, "out of memory");
        else if (!d->shape.rank || d->shape.rank > MA_MAX_DIMS || !d->shape.dims)
            rc = fail(E_MEM_INVALID_SHAPE, "memRegister: descriptor %u has rank %u and %s dimensions", i, d->shape.rank, d->shape.dims ? "its" : "no");
        else if (!dtype_known(d->dtype))
            rc = fail(E_MEM_INVALID_ARGUMENT, "memRegister: descriptor %u data type 0x%x", i, d->dtype);
        if (rc == E_OK) {
            need = elem_bytes(d->dtype);
            for (uint32_t k = 0; k < d->shape.rank; k++) {
                if (!d->shape.dims[k]) rc = fail(E_MEM_INVALID_SHAPE, "memRegister: descriptor %u dimension %u is 0", i, k);
                need *= d->shape.dims[k];
            }
        }
        if (rc == E_OK) {
            if (d->mem_type == Q_MEMTYPE_ION) {
                fd = d->u.ion.fd;
            } else if (d->mem_type == Q_MEMTYPE_CUSTOM && d->u.custom &&
                       ((const q_htp_mem_desc *)d->u.custom)->type == Q_HTP_MEM_SHARED_BUFFER) {
                const q_htp_mem_desc *hd = d->u.custom;
                fd = hd->u.shared.fd, offset = hd->u.shared.offset, declared = hd->size;
            } else {
                rc = fail(E_MEM_UNSUPPORTED_MEMTYPE, "memRegister: descriptor %u: memory type %u%s (the stand-in maps ION and HTP shared buffers)",
                          i, d->mem_type, d->mem_type == Q_MEMTYPE_CUSTOM ? " with a custom descriptor other than a shared buffer" : "");
            }
        }
        if (rc == E_OK && (!rpcmem_fd(fd) || fstat(fd, &st)))
            rc = fail(E_MEM_MAPPING, "memRegister: descriptor %u: fd %d is not a buffer from rpcmem_alloc", i, fd);
        if (rc == E_OK && (offset + need > (uint64_t)st.st_size || (declared && offset + need > declared) || (declared && declared > (uint64_t)st.st_size)))
            rc = fail(E_MEM_MAPPING, "memRegister: descriptor %u: %zu bytes at offset %llu do not fit the %lld-byte buffer", i, need,
                      (unsigned long long)offset, (long long)st.st_size);
        if (rc == E_OK) {
            pthread_mutex_lock(&lock);
            for (const mem_reg *p = mem_live; p && rc == E_OK; p = p->next)
                if (p->ctx == c && p->dev == st.st_dev && p->ino == st.st_ino && p->offset == offset)
                    rc = fail(E_MEM_ALREADY_REGISTERED, "memRegister: descriptor %u: fd %d offset %llu is already registered with this context", i,
                              fd, (unsigned long long)offset);
            pthread_mutex_unlock(&lock);
        }
        if (rc == E_OK) {
            m->map_len = (size_t)(offset + need);
            m->map = mmap(NULL, m->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m->map == MAP_FAILED) {
                m->map = NULL;
                rc = fail(E_MEM_MAPPING, "memRegister: descriptor %u: mmap of fd %d: %s", i, fd, strerror(errno));
            }
        }
        if (rc != E_OK) {
            trace("memRegister %s fd=%d refused", kind, fd);
            if (m) mem_unmap(m);
            pthread_mutex_lock(&lock); /* all or none */
            for (uint32_t k = 0; k < i; k++)
                for (mem_reg **mp = &mem_live; *mp; mp = &(*mp)->next)
                    if (*mp == made[k]) {
                        *mp = made[k]->next;
                        mem_unmap(made[k]);
                        break;
                    }
            pthread_mutex_unlock(&lock);
            free(made);
            return rc;
        }
        m->ctx = c;
        m->dev = st.st_dev, m->ino = st.st_ino, m->offset = offset;
        m->ptr = (unsigned char *)m->map + offset;
        m->bytes = need;
        m->dtype = d->dtype, m->rank = d->shape.rank;
        memcpy(m->dims, d->shape.dims, d->shape.rank * sizeof *m->dims);
        pthread_mutex_lock(&lock);
        m->next = mem_live;
        mem_live = m;
        pthread_mutex_unlock(&lock);
        made[i] = m;
        trace("memRegister %s fd=%d offset=%llu bytes=%zu", kind, fd, (unsigned long long)offset, need);
    }
    for (uint32_t i = 0; i < n; i++) handles[i] = made[i];
    free(made);
    return E_OK;
}

static q_status mem_deregister(const q_handle *handles, uint32_t n) {
    if (!handles || !n) return fail(E_MEM_INVALID_ARGUMENT, "memDeRegister: handles and their count are required");
    for (uint32_t i = 0; i < n; i++) {
        mem_reg *found = NULL;
        pthread_mutex_lock(&lock);
        for (mem_reg **mp = &mem_live; *mp; mp = &(*mp)->next)
            if (*mp == handles[i]) {
                found = *mp;
                *mp = found->next;
                break;
            }
        pthread_mutex_unlock(&lock);
        if (!found) {
            trace("memDeRegister refused: %p is not registered", handles[i]);
            return fail(E_MEM_INVALID_HANDLE, "memDeRegister: handle %u (%p) is not registered", i, handles[i]);
        }
        trace("memDeRegister bytes=%zu", found->bytes);
        mem_unmap(found);
    }
    return E_OK;
}

/* ================================================================== error messages */

static q_status error_message(q_status e, const char **msg) {
    if (!msg) return status_of(E_ERROR_INVALID_ARGUMENT);
    unsigned code = (unsigned)(e & 0xffff);
    const char *name = code_name(code);
    if (!name) {
        *msg = NULL;
        return status_of(E_ERROR_INVALID_HANDLE);
    }
    if (code == last_code && last_detail[0]) snprintf(message, sizeof message, "%s: %s", name, last_detail);
    else snprintf(message, sizeof message, "%s", name);
    *msg = message;
    return E_OK;
}

static q_status error_verbose(q_status e, const char **msg) {
    q_status rc = error_message(e, msg);
    if (rc == E_OK) *msg = strdup(*msg);
    return rc;
}

static q_status error_free_verbose(const char *msg) {
    free((void *)msg);
    return E_OK;
}

/* ================================================================== the tables */

static q_status unsupported(const char *what) {
    trace("%s (not implemented by the stand-in)", what);
    return fail(E_NOT_SUPPORTED, "%s is not implemented by the stand-in", what);
}
#define UNSUPPORTED_CORE(n) static q_status unsup_##n(void) { return unsupported(core_names[CI_##n]); }
#define UNSUPPORTED_SYS(n) static q_status unsup_sys_##n(void) { return unsupported(sys_names[SI_##n]); }
CORE_TABLE(UNSUPPORTED_CORE)
SYS_TABLE(UNSUPPORTED_SYS)
#define CORE_SLOT(n) (q_fn)unsup_##n,
#define SYS_SLOT(n) (q_fn)unsup_sys_##n,

/* room for a table of `bytes`: with MA_QNN_STUB_GUARD it ends where an inaccessible page starts */
static void *table_room(size_t bytes, size_t full) {
    if (guard_tables) {
        size_t pg = (size_t)sysconf(_SC_PAGESIZE), span = (bytes + pg - 1) / pg * pg;
        char *m = mmap(NULL, span + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return NULL;
        mprotect(m + span, pg, PROT_NONE);
        return m + span - bytes;
    }
    /* static storage, as a real library's tables are (a heap block would be left behind when the
     * client unloads the library: LeakSanitizer's report); entries the SDK does not have read NULL */
    static _Alignas(16) unsigned char rooms[2][2048];
    static atomic_int used; /* the two providers' mutexes differ: the slot is taken atomically */
    const int k = full > sizeof rooms[0] ? 2 : atomic_fetch_add(&used, 1);
    return k < 2 ? rooms[k] : NULL;
}

__attribute__((unused)) static const q_interface *core_provider(void) {
    static const q_interface *made;
    static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&m);
    if (!made) {
        q_fn all[CI_COUNT] = {CORE_TABLE(CORE_SLOT)};
        all[CI_propertyHasCapability] = (q_fn)property_has_capability;
        all[CI_backendCreate] = (q_fn)backend_create;
        all[CI_backendGetApiVersion] = (q_fn)backend_api_version;
        all[CI_backendGetBuildId] = (q_fn)backend_build_id;
        all[CI_backendFree] = (q_fn)backend_free;
        all[CI_contextCreateFromBinary] = (q_fn)context_create;
        all[CI_contextFree] = (q_fn)context_free;
        all[CI_graphRetrieve] = (q_fn)graph_retrieve;
        all[CI_graphExecute] = (q_fn)graph_execute;
        all[CI_logCreate] = (q_fn)log_create;
        all[CI_logSetLogLevel] = (q_fn)log_set_level;
        all[CI_logFree] = (q_fn)log_free;
        all[CI_memRegister] = (q_fn)mem_register;
        all[CI_memDeRegister] = (q_fn)mem_deregister;
        all[CI_deviceGetInfrastructure] = (q_fn)device_infrastructure;
        all[CI_deviceCreate] = (q_fn)device_create;
        all[CI_deviceFree] = (q_fn)device_free;
        all[CI_errorGetMessage] = (q_fn)error_message;
        all[CI_errorGetVerboseMessage] = (q_fn)error_verbose;
        all[CI_errorFreeVerboseMessage] = (q_fn)error_free_verbose;
        size_t bytes = sizeof(q_interface) + P.core_entries * sizeof(q_fn);
        q_interface *p = table_room(bytes, sizeof(q_interface) + CI_COUNT * sizeof(q_fn));
        if (p) {
            p->backend_id = Q_BACKEND_HTP;
            p->name = "molmoact-stub";
            p->api = (q_api_version){{P.major, P.minor, 0}, P.htp_api};
            memcpy(p->fn, all, P.core_entries * sizeof(q_fn));
        }
        made = p;
    }
    pthread_mutex_unlock(&m);
    return made;
}

static const q_sys_interface *sys_provider(void) {
    static const q_sys_interface *made;
    static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&m);
    if (!made) {
        q_fn all[SI_COUNT] = {SYS_TABLE(SYS_SLOT)};
        all[SI_systemContextCreate] = (q_fn)sys_create;
        all[SI_systemContextGetBinaryInfo] = (q_fn)sys_binary_info;
        all[SI_systemContextGetMetaData] = P.has_metadata ? (q_fn)sys_metadata : NULL;
        all[SI_systemContextFree] = (q_fn)sys_free;
        size_t bytes = sizeof(q_sys_interface) + P.sys_entries * sizeof(q_fn);
        q_sys_interface *p = table_room(bytes, sizeof(q_sys_interface) + SI_COUNT * sizeof(q_fn));
        if (p) {
            p->backend_id = Q_BACKEND_HTP;
            p->name = "molmoact-stub";
            p->sys_api = P.sys_api;
            memcpy(p->fn, all, P.sys_entries * sizeof(q_fn));
        }
        made = p;
    }
    pthread_mutex_unlock(&m);
    return made;
}

EXPORT q_status QnnSystemInterface_getProviders(const q_sys_interface ***list, uint32_t *n) {
    static const q_sys_interface *one[1];
    setup();
    if (!list || !n) return status_of(E_INTERFACE_INVALID_PARAMETER);
    if (!(one[0] = sys_provider())) return status_of(E_MEM_ALLOC);
    *list = (const q_sys_interface **)one;
    *n = 1;
    return E_OK;
}

#ifndef STUB_NO_INTERFACE
EXPORT q_status QnnInterface_getProviders(const q_interface ***list, uint32_t *n) {
    static const q_interface *one[1];
    setup();
    trace("getProviders");
    if (!list || !n) return status_of(E_INTERFACE_INVALID_PARAMETER);
    if (!(one[0] = core_provider())) return status_of(E_MEM_ALLOC);
    *list = (const q_interface **)one;
    *n = 1;
    return E_OK;
}
#endif
