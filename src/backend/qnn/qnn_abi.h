/* SPDX-License-Identifier: Apache-2.0 */
/* The part of the QNN C ABI (Qualcomm AI Engine Direct, QAIRT 2.x) that molmoact uses, declared
 * in our own words from public facts, so that nothing here needs the SDK's headers (which are
 * proprietary). Every layout is for LP64 (aarch64, x86-64); the sizes are checked below and, with
 * the SDK at hand, against its headers by `cmake -DMOLMOACT_QNN_SDK=DIR` (qnn_layout_check.c).
 *
 * Where each fact comes from (public code that uses or mirrors the API):
 *  - the interface table order and the provider struct: QnnInterface.h as vendored by
 *    budcribar/QualcommNPU (SDK 2.22.6) and its C# mirror SampleCSharpApplication/QnnInterface.cs
 *    (byte offsets 0..448); used the same way by onnxruntime's qnn_backend_manager.cc;
 *  - tensor v1/v2, data types, quantisation encodings, error code ranges: QnnTypes.h and
 *    QnnCommon.h of the same SDK copy;
 *  - the system interface and the binary / graph info: QnnSystemContext.h (same copy) and the
 *    consumers in qai-appbuilder, onnxruntime and executorch, which read binary info v1..v3 and
 *    graph info v1..v3 through the fields common to every version;
 *  - HTP device custom configs (soc model, arch): QnnHtpDevice.h of the same copy. */
#ifndef MA_QNN_ABI_H
#define MA_QNN_ABI_H

#include <stdarg.h>
#include <stdint.h>

typedef uint64_t qnn_err_t; /* the low 16 bits are the error code */
#define QNN_OK 0u
#define QNN_CODE(e) ((unsigned)((e) & 0xffffu))
typedef void *qnn_handle;

/* error codes a provider returns that we name */
#define QNN_ERR_COMMON_NOT_SUPPORTED 1000u
#define QNN_ERR_COMMON_INVALID_ARGUMENT 1004u
#define QNN_ERR_COMMON_INCOMPATIBLE_BINARIES 1008u
#define QNN_ERR_CONTEXT_FIRST 5000u
#define QNN_ERR_GRAPH_FIRST 6000u

typedef struct { uint32_t major, minor, patch; } qnn_version;
typedef struct { qnn_version core, backend; } qnn_api_version;

#define QNN_BACKEND_HTP 6u

/* data types: the high byte is the kind, the low byte the bits (hexadecimal, 0x16 = 16) */
enum {
    QNN_DT_INT_8 = 0x0008, QNN_DT_INT_16 = 0x0016, QNN_DT_INT_32 = 0x0032, QNN_DT_INT_64 = 0x0064,
    QNN_DT_UINT_8 = 0x0108, QNN_DT_UINT_16 = 0x0116, QNN_DT_UINT_32 = 0x0132, QNN_DT_UINT_64 = 0x0164,
    QNN_DT_FLOAT_16 = 0x0216, QNN_DT_FLOAT_32 = 0x0232,
    QNN_DT_SFIXED_8 = 0x0308, QNN_DT_SFIXED_16 = 0x0316,
    QNN_DT_UFIXED_8 = 0x0408, QNN_DT_UFIXED_16 = 0x0416,
    QNN_DT_BOOL_8 = 0x0508,
};

enum { QNN_TENSOR_APP_WRITE = 0, QNN_TENSOR_APP_READ = 1 };
enum { QNN_MEM_RAW = 0, QNN_MEM_HANDLE = 1 };
enum { QNN_QENC_SCALE_OFFSET = 0, QNN_QENC_AXIS_SCALE_OFFSET = 1, QNN_QENC_BW_SCALE_OFFSET = 2, QNN_QENC_UNDEFINED = 0x7fffffff };
enum { QNN_DEF_DEFINED = 1 };

/* real = (stored + offset) * scale */
typedef struct { float scale; int32_t offset; } qnn_scale_offset;
typedef struct { uint32_t bitwidth; float scale; int32_t offset; } qnn_bw_scale_offset;

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

typedef struct { void *data; uint32_t size; } qnn_client_buf;

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
    union { qnn_client_buf client; qnn_handle mem; } buf;
} qnn_tensor_v1;

typedef struct {
    qnn_tensor_v1 v1; /* version 2 begins with every field of version 1 */
    uint8_t *dynamic_dims;
    struct { uint32_t type; uint32_t a, b; } sparse;
    uint8_t produced;
} qnn_tensor_v2;

typedef struct {
    uint32_t version; /* 1 or 2 */
    union { qnn_tensor_v1 v1; qnn_tensor_v2 v2; } u;
} qnn_tensor;

_Static_assert(sizeof(void *) == 8, "the QNN declarations are for LP64");
_Static_assert(sizeof(qnn_quant_params) == 40, "Qnn_QuantizeParams_t is 40 bytes");
_Static_assert(sizeof(qnn_tensor_v1) == 112, "Qnn_TensorV1_t is 112 bytes");
_Static_assert(sizeof(qnn_tensor_v2) == 136, "Qnn_TensorV2_t is 136 bytes");
_Static_assert(sizeof(qnn_tensor) == 144, "Qnn_Tensor_t is 144 bytes");

/* log callback: (format, level 1 error .. 5 debug, timestamp, arguments) */
typedef void (*qnn_log_cb)(const char *fmt, uint32_t level, uint64_t timestamp, va_list args);

/* device configs: a NULL-terminated array of pointers; option 0 = a backend-specific config */
typedef struct { uint32_t option; const void *custom; } qnn_device_config;
enum { QNN_DEVICE_CONFIG_CUSTOM = 0 };
/* HTP custom device config: option 0 = soc model, 1 = minimum arch {device id, arch} */
typedef struct {
    uint32_t option;
    union { uint32_t soc_model; struct { uint32_t device_id; uint32_t arch; } arch; } u;
} qnn_htp_device_config;
enum { QNN_HTP_DEVICE_CONFIG_SOC = 0, QNN_HTP_DEVICE_CONFIG_ARCH = 1 };

typedef qnn_err_t (*qnn_fn)(void); /* an entry we do not call */

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
    qnn_err_t (*context_create_from_binary)(qnn_handle backend, qnn_handle device, const void **config, const void *buf,
                                            uint64_t size, qnn_handle *context, qnn_handle profile);
    qnn_err_t (*context_free)(qnn_handle context, qnn_handle profile);
    qnn_fn graph_create, graph_create_subgraph, graph_set_config, graph_add_node, graph_finalize;
    qnn_err_t (*graph_retrieve)(qnn_handle context, const char *name, qnn_handle *graph);
    qnn_err_t (*graph_execute)(qnn_handle graph, const qnn_tensor *in, uint32_t n_in, qnn_tensor *out, uint32_t n_out,
                               qnn_handle profile, qnn_handle signal);
    qnn_fn graph_execute_async;
    qnn_fn tensor_create_context_tensor, tensor_create_graph_tensor;
    qnn_err_t (*log_create)(qnn_log_cb cb, uint32_t max_level, qnn_handle *log);
    qnn_fn log_set_level;
    qnn_err_t (*log_free)(qnn_handle log);
    qnn_fn profile_create, profile_set_config, profile_get_events, profile_get_sub_events, profile_get_event_data,
        profile_get_extended_event_data, profile_free;
    qnn_fn mem_register, mem_deregister;
    qnn_fn device_get_platform_info, device_free_platform_info, device_get_infrastructure;
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

/* ---- the system library: binary info */
typedef struct {
    const char *name;
    uint32_t n_inputs;
    qnn_tensor *inputs;
    uint32_t n_outputs;
    qnn_tensor *outputs;
    /* versions 2 and 3 append fields after these */
} qnn_graph_info_common;

typedef struct {
    uint32_t version; /* 1..3 */
    qnn_graph_info_common g;
} qnn_graph_info;

typedef struct {
    uint32_t backend_id;
    const char *build_id;
    qnn_version core_api, backend_api;
    const char *soc_version;
    qnn_version hw_blob_version, context_blob_version;
    uint32_t hw_blob_size;
    void *hw_blob;
    uint64_t context_blob_size;
    uint32_t n_context_tensors;
    qnn_tensor *context_tensors;
    uint32_t n_graphs;
    qnn_graph_info *graphs;
    /* versions 2 and 3 append fields after these */
} qnn_binary_info_common;

typedef struct {
    uint32_t version; /* 1..3 */
    qnn_binary_info_common b;
} qnn_binary_info;

_Static_assert(__builtin_offsetof(qnn_binary_info_common, graphs) == 120, "graphs at byte 120 of binary info v1");

typedef struct {
    qnn_err_t (*context_create)(qnn_handle *sys);
    qnn_err_t (*context_get_binary_info)(qnn_handle sys, void *buf, uint64_t size, const qnn_binary_info **info,
                                         uint64_t *info_size);
    qnn_fn context_get_metadata; /* the newer form of get_binary_info (not used) */
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

/* the API generation this code was written for (QAIRT 2.2x..2.4x): core 2.x with x >= 14 */
#define MA_QNN_CORE_MAJOR 2u
#define MA_QNN_CORE_MIN_MINOR 14u
#define MA_QNN_SYSTEM_MAJOR 1u

#endif
