/* SPDX-License-Identifier: Apache-2.0 */
/* The part of the QNN C ABI (Qualcomm AI Engine Direct, QAIRT 2.x) that molmoact uses, declared
 * in our own words from public facts, so that nothing here needs the SDK's headers (which are
 * proprietary). Every layout is for LP64 (aarch64, x86-64); the sizes are checked below and, with
 * the SDK at hand, against its headers by `cmake -DMOLMOACT_QNN_SDK=DIR` (qnn_layout_check.c).
 *
 * Where each fact comes from: the public copies of the SDK's headers, compiled for aarch64 and
 * x86-64 to read every offset and size (identical on both):
 *   SDK 2.22.6  budcribar/QualcommNPU @ f0843ce860f0263a832f9db1415af7edb494174a (core API 2.15)
 *   SDK 2.25.0  qdsp6sw/qualcomm-ai-engine-direct-sdk @ e32f4b482c9d0f941eae317e5a5d6dd48d600352 (2.18)
 *   SDK 2.36.1  qualcomm/geniex-qairt-plugin @ fb1c582bad66efbfa02dac83f5cc0f31afd26ee1 (2.27)
 *   SDK 2.40.0  kyungraekim/qnn @ da1ce8781f9ecb536517002b3c6eaa51602e7a08 (2.30)
 *   SDK 2.43.0  chuzcjoe/qnnx @ 844820579ee06d25091df5fbf5b0cf83a252271d (2.32)
 * and the consumers that read the same structures: onnxruntime's QNN provider
 * (microsoft/onnxruntime qnn_model.cc @ 00565edf074a263e7cb17325d5ecd0f4718d0bc0: binary info v3
 * and graph info v3 from API 2.21 / SDK 2.28, graph info v2 from 2.18; onnxruntime/onnxruntime-qnn
 * @ cee6c0d91e583d43f5ecef6391e93c19b4042c0f qnn_htp_power_config_manager.cc: the power votes,
 * rpcmem and memRegister), LiteRT context_binary_info.cc @ 44acf0393dc6226241ee749b3c33622e9d7c63ef,
 * sherpa-onnx csrc/qnn/utils.cc @ 0dba87d5c1cc9aa0c1e14845ddc37af1115e3b0a, and the rpcmem API of
 * qualcomm/fastrpc inc/rpcmem.h @ ed52d6037d0e27dc5f73f085a1b8c32ffe702104. */
#ifndef MA_QNN_ABI_H
#define MA_QNN_ABI_H

#include <stdarg.h>
#include <stdint.h>

typedef uint64_t qnn_err_t; /* the low 16 bits are the error code */
#define QNN_OK 0u
#define QNN_CODE(e) ((unsigned)((e)&0xffffu))
typedef void *qnn_handle;

/* error codes (the low 16 bits of an error handle) that we act on or name; ma_qnn_error_name in
 * qnn.c names the rest of the published ones */
#define QNN_ERR_COMMON_NOT_SUPPORTED 1000u
#define QNN_ERR_COMMON_INVALID_ARGUMENT 1004u
#define QNN_ERR_COMMON_SYSTEM_COMMUNICATION 1007u /* the DSP subsystem restarted (recovered) */
#define QNN_ERR_COMMON_INCOMPATIBLE_BINARIES 1008u
#define QNN_ERR_COMMON_SYSTEM_COMMUNICATION_FATAL 1011u /* the DSP subsystem restart did not recover */
#define QNN_ERR_CONTEXT_CREATE_FROM_BINARY 5005u
#define QNN_ERR_GRAPH_DOES_NOT_EXIST 6002u

typedef struct {
    uint32_t major, minor, patch;
} qnn_version;
typedef struct {
    qnn_version core, backend;
} qnn_api_version;

#define QNN_BACKEND_HTP 6u

/* data types: the high byte is the kind, the low byte the bits (hexadecimal, 0x16 = 16) */
enum {
    QNN_DT_INT_8 = 0x0008,
    QNN_DT_INT_16 = 0x0016,
    QNN_DT_INT_32 = 0x0032,
    QNN_DT_INT_64 = 0x0064,
    QNN_DT_UINT_8 = 0x0108,
    QNN_DT_UINT_16 = 0x0116,
    QNN_DT_UINT_32 = 0x0132,
    QNN_DT_UINT_64 = 0x0164,
    QNN_DT_FLOAT_16 = 0x0216,
    QNN_DT_FLOAT_32 = 0x0232,
    QNN_DT_SFIXED_8 = 0x0308,
    QNN_DT_SFIXED_16 = 0x0316,
    QNN_DT_UFIXED_8 = 0x0408,
    QNN_DT_UFIXED_16 = 0x0416,
    QNN_DT_BOOL_8 = 0x0508,
};

enum { QNN_TENSOR_APP_WRITE = 0, QNN_TENSOR_APP_READ = 1 };
enum { QNN_MEM_RAW = 0, QNN_MEM_HANDLE = 1 };
enum { QNN_MEM_RETRIEVE_RAW = 2 };
/* quantisation encodings: we apply the two per-tensor ones (scale-offset, with or without a bit
 * width) and refuse every other by name (per axis, per block, vector, float block, mapped) */
enum {
    QNN_QENC_SCALE_OFFSET = 0,
    QNN_QENC_AXIS_SCALE_OFFSET = 1,
    QNN_QENC_BW_SCALE_OFFSET = 2,
    QNN_QENC_BW_AXIS_SCALE_OFFSET = 3,
    QNN_QENC_BLOCK = 4,
    QNN_QENC_BLOCKWISE_EXPANSION = 5,
    QNN_QENC_VECTOR = 6,
    QNN_QENC_FLOAT_BLOCK = 7,
    QNN_QENC_BW_AXIS_SCALE_OFFSET_MAPPED = 8,
    QNN_QENC_BW_BLOCK_MAPPED = 9,
    QNN_QENC_BW_BLOCKWISE_EXPANSION_MAPPED = 10,
    QNN_QENC_BW_FLOAT_BLOCK = 11,
    QNN_QENC_UNDEFINED = 0x7fffffff
};
enum { QNN_DEF_IMPL_GENERATED = 0, QNN_DEF_DEFINED = 1, QNN_DEF_UNDEFINED = 0x7fffffff };

/* real = (stored + offset) * scale */
typedef struct {
    float scale;
    int32_t offset;
} qnn_scale_offset;
typedef struct {
    uint32_t bitwidth;
    float scale;
    int32_t offset;
} qnn_bw_scale_offset;

typedef struct {
    uint32_t definition;
    uint32_t encoding;
    union {
        qnn_scale_offset so;
        qnn_bw_scale_offset bw;
        unsigned char space[32]; /* the largest encoding (bitwidth + per-axis pointers) */
    } u;
    /* the union is pointer-aligned: the per-axis encodings hold pointers */
} qnn_quant_params __attribute__((aligned(8)));

typedef struct {
    void *data;
    uint32_t size;
} qnn_client_buf;

typedef struct {
    uint32_t id;
    const char *name;
    uint32_t type;
    uint32_t data_format;
    uint32_t data_type;
    qnn_quant_params quant;
    uint32_t rank;
    uint32_t *dims;
    uint32_t mem_type;
    union {
        qnn_client_buf client;
        qnn_handle mem;
    } buf;
} qnn_tensor_v1;

typedef struct {
    qnn_tensor_v1 v1; /* version 2 begins with every field of version 1 */
    uint8_t *dynamic_dims;
    struct {
        uint32_t type;
        uint32_t a, b;
    } sparse;
    uint8_t produced;
} qnn_tensor_v2;

typedef struct {
    uint32_t version; /* 1 or 2 */
    union {
        qnn_tensor_v1 v1;
        qnn_tensor_v2 v2;
    } u;
} qnn_tensor;

_Static_assert(sizeof(void *) == 8, "the QNN declarations are for LP64");
_Static_assert(sizeof(qnn_quant_params) == 40, "Qnn_QuantizeParams_t is 40 bytes");
_Static_assert(sizeof(qnn_tensor_v1) == 112, "Qnn_TensorV1_t is 112 bytes");
_Static_assert(sizeof(qnn_tensor_v2) == 136, "Qnn_TensorV2_t is 136 bytes");
_Static_assert(sizeof(qnn_tensor) == 144, "Qnn_Tensor_t is 144 bytes");

/* log callback: (format, level 1 error .. 5 debug, timestamp, arguments) */
typedef void (*qnn_log_cb)(const char *fmt, uint32_t level, uint64_t timestamp, va_list args);

/* device configs: a NULL-terminated array of pointers; option 0 = a backend-specific config */
typedef struct {
    uint32_t option;
    const void *custom;
} qnn_device_config;
enum { QNN_DEVICE_CONFIG_CUSTOM = 0 };
/* HTP custom device config: option 0 = soc model, 1 = minimum arch {device id, arch}. Two
 * layouts, chosen by the backend API version the loaded libQnnHtp.so reports (never by the
 * headers we were built against):
 *   up to HTP API 5.4x: every member of the union is 32-bit, so the union follows the option at
 *     byte 4 and the struct is 12 bytes (SDK 2.43's HTP/QnnHtpDevice.h, chuzcjoe/qnnx @
 *     4d4c8dc5ed142883ddc75e567d9d33a5cd4e61d7);
 *   from HTP API 5.48 (SDK 2.48, as issue 36's review found): the union also holds a pointer
 *     (an extension config), which aligns it to 8: socModel and the arch pair start at byte 8 and
 *     the struct is 16 bytes (the public copy of the SDK's shared HTP device config types header).
 * A config written at the wrong offset reads as soc 0 / device 73 to the library. */
typedef struct {
    uint32_t option;
    union {
        uint32_t soc_model;
        struct {
            uint32_t device_id;
            uint32_t arch;
        } arch;
    } u;
} qnn_htp_device_config;
typedef struct {
    uint32_t option;
    union {
        uint32_t soc_model;
        struct {
            uint32_t device_id;
            uint32_t arch;
        } arch;
        void *extension;
    } u;
} qnn_htp_device_config_548;
_Static_assert(__builtin_offsetof(qnn_htp_device_config, u) == 4 && sizeof(qnn_htp_device_config) == 12, "HTP device config to 5.4x");
_Static_assert(__builtin_offsetof(qnn_htp_device_config_548, u) == 8 && sizeof(qnn_htp_device_config_548) == 16,
               "HTP device config from 5.48");
#define MA_QNN_HTP_DEVICE_CONFIG_PTR_MINOR 48u /* HTP API 5.x from which the union holds a pointer */
enum { QNN_HTP_DEVICE_CONFIG_SOC = 0, QNN_HTP_DEVICE_CONFIG_ARCH = 1 };

typedef qnn_err_t (*qnn_fn)(void); /* an entry we do not call */
struct qnn_mem_descriptor;

/* the core interface table, in its published order (entries past graphGetProperty exist only in
 * newer minor versions and are not used) */
typedef struct {
    qnn_err_t (*property_has_capability)(uint32_t key);
    qnn_err_t (*backend_create)(qnn_handle log, const void **config, qnn_handle *backend);
    qnn_fn backend_set_config;
    qnn_err_t (*backend_get_api_version)(qnn_api_version *v);
    qnn_err_t (*backend_get_build_id)(const char **id);
    qnn_fn backend_register_op_package, backend_get_supported_operations, backend_validate_op_config;
    qnn_err_t (*backend_free)(qnn_handle backend);
    qnn_fn context_create, context_set_config, context_get_binary_size, context_get_binary;
    qnn_err_t (*context_create_from_binary)(qnn_handle backend, qnn_handle device, const void **config, const void *buf, uint64_t size,
                                            qnn_handle *context, qnn_handle profile);
    qnn_err_t (*context_free)(qnn_handle context, qnn_handle profile);
    qnn_fn graph_create, graph_create_subgraph, graph_set_config, graph_add_node, graph_finalize;
    qnn_err_t (*graph_retrieve)(qnn_handle context, const char *name, qnn_handle *graph);
    qnn_err_t (*graph_execute)(qnn_handle graph, const qnn_tensor *in, uint32_t n_in, qnn_tensor *out, uint32_t n_out, qnn_handle profile,
                               qnn_handle signal);
    qnn_fn graph_execute_async;
    qnn_fn tensor_create_context_tensor, tensor_create_graph_tensor;
    qnn_err_t (*log_create)(qnn_log_cb cb, uint32_t max_level, qnn_handle *log);
    qnn_fn log_set_level;
    qnn_err_t (*log_free)(qnn_handle log);
    qnn_fn profile_create, profile_set_config, profile_get_events, profile_get_sub_events, profile_get_event_data,
        profile_get_extended_event_data, profile_free;
    qnn_err_t (*mem_register)(qnn_handle context, const struct qnn_mem_descriptor *desc, uint32_t n, qnn_handle *handles);
    qnn_err_t (*mem_deregister)(const qnn_handle *handles, uint32_t n);
    qnn_fn device_get_platform_info, device_free_platform_info;
    qnn_err_t (*device_get_infrastructure)(void **infrastructure); /* HTP: a qnn_htp_infrastructure */
    qnn_err_t (*device_create)(qnn_handle log, const qnn_device_config *const *config, qnn_handle *device);
    qnn_fn device_set_config, device_get_info;
    qnn_err_t (*device_free)(qnn_handle device);
    qnn_fn signal_create, signal_set_config, signal_trigger, signal_free;
    qnn_err_t (*error_get_message)(qnn_err_t e, const char **msg);
    qnn_fn error_get_verbose_message, error_free_verbose_message;
    qnn_fn graph_prepare_execution_environment, graph_release_execution_environment, graph_get_property;
} qnn_interface_table;

_Static_assert(sizeof(qnn_interface_table) == 54 * 8, "54 entries up to graphGetProperty");

typedef struct {
    uint32_t backend_id;
    const char *provider_name;
    qnn_api_version api_version;
    qnn_interface_table t; /* the version-named union member (all 2.x versions share this prefix) */
} qnn_interface;

_Static_assert(__builtin_offsetof(qnn_interface, t) == 40, "the table follows the 40-byte header");

typedef qnn_err_t (*qnn_get_providers_fn)(const qnn_interface ***list, uint32_t *n);

/* ---- the system library: binary info
 * QnnSystemContext_getBinaryInfo (deprecated; it takes a writable buffer) and _getMetadata (a
 * const buffer, preferred) return a binary info tagged with its version. Versions 1 and 2 share
 * one layout (2 appends platform info); version 3 (SDK 2.28 and later) drops the three hardware
 * blob fields, so everything after socVersion moves up: the graphs are at +88/+96 of the union,
 * not +112/+120. */
typedef struct {
    uint32_t backend_id;
    const char *build_id;
    qnn_version core_api, backend_api; /* the producer's, not the loaded library's */
    const char *soc_version;
    qnn_version hw_blob_version, context_blob_version;
    uint32_t hw_blob_size;
    void *hw_blob;
    uint64_t context_blob_size;
    uint32_t n_context_tensors;
    qnn_tensor *context_tensors;
    uint32_t n_graphs;
    void *graphs;        /* graph infos at the library's stride (ma_qnn_graph_stride) */
    void *platform_info; /* version 2 */
} qnn_binary_info_v1;

typedef struct {
    uint32_t backend_id;
    const char *build_id;
    qnn_version core_api, backend_api;
    const char *soc_version;
    qnn_version context_blob_version;
    uint64_t context_blob_size;
    uint32_t n_context_tensors;
    qnn_tensor *context_tensors;
    uint32_t n_graphs;
    void *graphs;
    void *platform_info;
    uint32_t metadata_size;
    void *metadata;
    uint32_t soc_model;
} qnn_binary_info_v3;

typedef struct {
    uint32_t version; /* 1, 2 (the v1 view) or 3 */
    union {
        qnn_binary_info_v1 v1;
        qnn_binary_info_v3 v3;
    } u;
} qnn_binary_info;

_Static_assert(__builtin_offsetof(qnn_binary_info_v1, n_graphs) == 112, "binary info v1/v2: numGraphs at +112");
_Static_assert(__builtin_offsetof(qnn_binary_info_v1, graphs) == 120, "binary info v1/v2: graphs at +120");
_Static_assert(__builtin_offsetof(qnn_binary_info_v3, n_graphs) == 88, "binary info v3: numGraphs at +88");
_Static_assert(__builtin_offsetof(qnn_binary_info_v3, graphs) == 96, "binary info v3: graphs at +96");
_Static_assert(__builtin_offsetof(qnn_binary_info_v3, metadata_size) == 112, "binary info v3: contextMetadataSize at +112");
_Static_assert(__builtin_offsetof(qnn_binary_info_v3, soc_model) == 128, "binary info v3: socModel at +128");
_Static_assert(__builtin_offsetof(qnn_binary_info, u) == 8 && sizeof(qnn_binary_info) == 144, "QnnSystemContext_BinaryInfo_t is 144 bytes");

/* Graph infos: the name and the inputs / outputs are the first fields of every version (1: 40
 * bytes; 2 adds the updateable tensors: 56; 3 adds the graph blob info and the op index range:
 * 80). The array's stride is sizeof(QnnSystemContext_GraphInfo_t) of the library that filled it,
 * which no call reports: 48 bytes up to core API 2.16 (SDK 2.23), 64 from 2.17 (SDK 2.24) to 2.20,
 * 88 from 2.21 (SDK 2.28). */
typedef struct {
    const char *name;
    uint32_t n_inputs;
    qnn_tensor *inputs;
    uint32_t n_outputs;
    qnn_tensor *outputs;
} qnn_graph_info_v1;

typedef struct {
    qnn_graph_info_v1 v1;
    uint32_t n_updateable;
    qnn_tensor *updateable;
    uint32_t blob_info_size; /* version 3 */
    void *blob_info;
    uint32_t first_op, last_op;
} qnn_graph_info_v3;

typedef struct {
    uint32_t version; /* 1..3 */
    union {
        qnn_graph_info_v1 v1;
        qnn_graph_info_v3 v3;
    } u;
} qnn_graph_info;

_Static_assert(__builtin_offsetof(qnn_graph_info, u) == 8, "graph info: the union at 8");
_Static_assert(sizeof(qnn_graph_info_v1) == 40 && sizeof(qnn_graph_info_v3) == 80, "graph info v1 40, v3 80 bytes");
_Static_assert(sizeof(qnn_graph_info) == 88, "QnnSystemContext_GraphInfo_t with version 3: 88 bytes");
#define MA_QNN_GRAPH_STRIDE_V1 48u
#define MA_QNN_GRAPH_STRIDE_V2 64u
#define MA_QNN_GRAPH_STRIDE_V3 88u
/* the newest core API whose stride was read from its headers (SDK 2.43); a newer library's
 * multi-graph binary is read only when every entry checks out at the newest stride */
#define MA_QNN_CORE_MINOR_VERIFIED 32u
static inline unsigned ma_qnn_graph_stride(unsigned core_minor) {
    return core_minor <= 16 ? MA_QNN_GRAPH_STRIDE_V1 : core_minor <= 20 ? MA_QNN_GRAPH_STRIDE_V2 : MA_QNN_GRAPH_STRIDE_V3;
}

typedef struct {
    qnn_err_t (*context_create)(qnn_handle *sys);
    qnn_err_t (*context_get_binary_info)(qnn_handle sys, void *buf, uint64_t size, const qnn_binary_info **info, uint64_t *info_size);
    qnn_err_t (*context_get_metadata)(qnn_handle sys, const void *buf, uint64_t size, const qnn_binary_info **info);
    qnn_err_t (*context_free)(qnn_handle sys);
} qnn_system_table;

typedef struct {
    uint32_t backend_id;
    const char *provider_name;
    qnn_version api_version;
    qnn_system_table t;
} qnn_system_interface;

_Static_assert(__builtin_offsetof(qnn_system_interface, t) == 32, "the system table follows the 32-byte header");

typedef qnn_err_t (*qnn_system_get_providers_fn)(const qnn_system_interface ***list, uint32_t *n);

/* ---- zero-copy buffers: an rpcmem allocation (libcdsprpc.so) registered with a context as an
 * ION descriptor; a tensor then names the handle (mem type QNN_MEM_HANDLE) instead of a client
 * buffer. Deregistered before the context is freed, freed after. */
typedef struct qnn_mem_descriptor {
    struct {
        uint32_t rank;
        uint32_t *dims;
        const char *shape_config;
    } shape;
    uint32_t data_type;
    uint32_t mem_type; /* QNN_MEMTYPE_ION */
    union {
        int32_t ion_fd;
        void *custom;
        struct {
            int32_t fd;
            void *data;
        } dma_buf;
    } u;
} qnn_mem_descriptor;
enum { QNN_MEMTYPE_ION = 1, QNN_MEMTYPE_CUSTOM = 2, QNN_MEMTYPE_DMA_BUF = 3 };
_Static_assert(sizeof(qnn_mem_descriptor) == 48 && __builtin_offsetof(qnn_mem_descriptor, u) == 32, "Qnn_MemDescriptor_t is 48 bytes");
#define MA_RPCMEM_HEAP_ID_SYSTEM 25
#define MA_RPCMEM_DEFAULT_FLAGS 1u

/* ---- the HTP performance vote: deviceGetInfrastructure gives the HTP infrastructure, whose
 * power config ids take NULL-terminated lists of power configs (DCVS v3, RPC latency, polling) */
typedef struct {
    uint32_t type; /* 0: the performance infrastructure */
    qnn_err_t (*create_power_config_id)(uint32_t device_id, uint32_t core_id, uint32_t *id);
    qnn_err_t (*destroy_power_config_id)(uint32_t id);
    qnn_err_t (*set_power_config)(uint32_t id, const void *const *configs); /* qnn_htp_power_config */
    qnn_fn set_memory_config;
} qnn_htp_infrastructure;
_Static_assert(__builtin_offsetof(qnn_htp_infrastructure, create_power_config_id) == 8 && sizeof(qnn_htp_infrastructure) == 40,
               "QnnHtpDevice_Infrastructure_t: the perf functions from byte 8");

typedef struct {
    uint32_t context_id; /* the power config id */
    uint32_t set_dcvs_enable, dcvs_enable, power_mode;
    uint32_t set_sleep_latency, sleep_latency_us;
    uint32_t set_sleep_disable, sleep_disable;
    uint32_t set_bus_params, bus_corner_min, bus_corner_target, bus_corner_max;
    uint32_t set_core_params, core_corner_min, core_corner_target, core_corner_max;
} qnn_htp_dcvs_v3;

typedef struct {
    uint32_t option; /* QNN_HTP_POWER_* */
    union {
        qnn_htp_dcvs_v3 dcvs;
        uint32_t rpc_control_latency_us;
        uint32_t rpc_polling_time_us;
    } u;
} qnn_htp_power_config;
_Static_assert(sizeof(qnn_htp_power_config) == 68 && __builtin_offsetof(qnn_htp_power_config, u) == 4, "the power config is 68 bytes");
enum { QNN_HTP_POWER_DCVS_V3 = 1, QNN_HTP_POWER_RPC_CONTROL_LATENCY = 2, QNN_HTP_POWER_RPC_POLLING_TIME = 3 };
enum { QNN_HTP_POWER_MODE_PERFORMANCE = 0x10 };
enum { QNN_HTP_CORNER_TURBO = 0x80, QNN_HTP_CORNER_MAX = 0xa0 };

/* the API generation this code was written for (QAIRT 2.2x..2.4x): core 2.x with x >= 14 */
#define MA_QNN_CORE_MAJOR 2u
#define MA_QNN_CORE_MIN_MINOR 14u
#define MA_QNN_SYSTEM_MAJOR 1u

#endif
