/* SPDX-License-Identifier: Apache-2.0 */
/* Our QNN declarations (qnn_abi.h) against the SDK's own headers: compiled only when the SDK is
 * at hand (cmake -DMOLMOACT_QNN_SDK=/path/to/qairt/2.4x), where every assertion below must hold.
 * Nothing here is built or linked into molmoact; the build fails if a size, an offset or an enum
 * value we rely on differs from the SDK's. */
#include <stdbool.h>
#include <stddef.h>

#include "HTP/QnnHtpCommon.h"
#include "HTP/QnnHtpDevice.h"
#include "HTP/QnnHtpPerfInfrastructure.h"
#include "QnnMem.h"
#include "QnnInterface.h"
#include "System/QnnSystemInterface.h"

#include "backend/qnn/qnn_abi.h"

#define SAME_OFFSET(T1, f1, T2, f2) _Static_assert(offsetof(T1, f1) == offsetof(T2, f2), #T1 "." #f1 " is at our " #T2 "." #f2)
#define SAME_SIZE(T1, T2) _Static_assert(sizeof(T1) == sizeof(T2), "sizeof " #T1 " == sizeof " #T2)
#define SAME_VALUE(a, b) _Static_assert((long long)(a) == (long long)(b), #a " == " #b)

/* versions and ids */
SAME_VALUE(QNN_API_VERSION_MAJOR, MA_QNN_CORE_MAJOR);
_Static_assert(QNN_API_VERSION_MINOR >= MA_QNN_CORE_MIN_MINOR, "the SDK's API is at least the minimum we accept");
SAME_VALUE(QNN_SYSTEM_API_VERSION_MAJOR, MA_QNN_SYSTEM_MAJOR);
SAME_VALUE(QNN_BACKEND_ID_HTP, QNN_BACKEND_HTP);
SAME_VALUE(QNN_SUCCESS, QNN_OK);

/* data types and enums */
SAME_VALUE(QNN_DATATYPE_FLOAT_32, QNN_DT_FLOAT_32);
SAME_VALUE(QNN_DATATYPE_FLOAT_16, QNN_DT_FLOAT_16);
SAME_VALUE(QNN_DATATYPE_UFIXED_POINT_8, QNN_DT_UFIXED_8);
SAME_VALUE(QNN_DATATYPE_UFIXED_POINT_16, QNN_DT_UFIXED_16);
SAME_VALUE(QNN_DATATYPE_SFIXED_POINT_8, QNN_DT_SFIXED_8);
SAME_VALUE(QNN_DATATYPE_SFIXED_POINT_16, QNN_DT_SFIXED_16);
SAME_VALUE(QNN_DATATYPE_INT_8, QNN_DT_INT_8);
SAME_VALUE(QNN_DATATYPE_INT_32, QNN_DT_INT_32);
SAME_VALUE(QNN_DATATYPE_INT_64, QNN_DT_INT_64);
SAME_VALUE(QNN_DATATYPE_UINT_8, QNN_DT_UINT_8);
SAME_VALUE(QNN_DATATYPE_UINT_32, QNN_DT_UINT_32);
SAME_VALUE(QNN_DATATYPE_BOOL_8, QNN_DT_BOOL_8);
SAME_VALUE(QNN_TENSOR_TYPE_APP_WRITE, QNN_TENSOR_APP_WRITE);
SAME_VALUE(QNN_TENSOR_TYPE_APP_READ, QNN_TENSOR_APP_READ);
SAME_VALUE(QNN_TENSORMEMTYPE_RAW, QNN_MEM_RAW);
SAME_VALUE(QNN_QUANTIZATION_ENCODING_SCALE_OFFSET, QNN_QENC_SCALE_OFFSET);
SAME_VALUE(QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET, QNN_QENC_BW_SCALE_OFFSET);
SAME_VALUE(QNN_DEFINITION_DEFINED, QNN_DEF_DEFINED);
SAME_VALUE(QNN_DEVICE_CONFIG_OPTION_CUSTOM, QNN_DEVICE_CONFIG_CUSTOM);
SAME_VALUE(QNN_HTP_DEVICE_CONFIG_OPTION_SOC, QNN_HTP_DEVICE_CONFIG_SOC);
SAME_VALUE(QNN_HTP_DEVICE_CONFIG_OPTION_ARCH, QNN_HTP_DEVICE_CONFIG_ARCH);
SAME_VALUE(QNN_TENSOR_VERSION_1, 1);
SAME_VALUE(QNN_TENSOR_VERSION_2, 2);
SAME_VALUE(QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_1, 1);
SAME_VALUE(QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_1, 1);

/* tensors */
SAME_SIZE(Qnn_QuantizeParams_t, qnn_quant_params);
SAME_OFFSET(Qnn_QuantizeParams_t, quantizationEncoding, qnn_quant_params, encoding);
SAME_OFFSET(Qnn_QuantizeParams_t, scaleOffsetEncoding, qnn_quant_params, u.so);
SAME_OFFSET(Qnn_QuantizeParams_t, bwScaleOffsetEncoding, qnn_quant_params, u.bw);
SAME_SIZE(Qnn_TensorV1_t, qnn_tensor_v1);
SAME_OFFSET(Qnn_TensorV1_t, name, qnn_tensor_v1, name);
SAME_OFFSET(Qnn_TensorV1_t, type, qnn_tensor_v1, type);
SAME_OFFSET(Qnn_TensorV1_t, dataFormat, qnn_tensor_v1, data_format);
SAME_OFFSET(Qnn_TensorV1_t, dataType, qnn_tensor_v1, data_type);
SAME_OFFSET(Qnn_TensorV1_t, quantizeParams, qnn_tensor_v1, quant);
SAME_OFFSET(Qnn_TensorV1_t, rank, qnn_tensor_v1, rank);
SAME_OFFSET(Qnn_TensorV1_t, dimensions, qnn_tensor_v1, dims);
SAME_OFFSET(Qnn_TensorV1_t, memType, qnn_tensor_v1, mem_type);
SAME_OFFSET(Qnn_TensorV1_t, clientBuf, qnn_tensor_v1, buf.client);
SAME_OFFSET(Qnn_TensorV2_t, isDynamicDimensions, qnn_tensor_v2, dynamic_dims);
SAME_OFFSET(Qnn_TensorV2_t, isProduced, qnn_tensor_v2, produced);
/* a later SDK may append to version 2; we copy a graph's descriptor whole, so its size must match */
SAME_SIZE(Qnn_TensorV2_t, qnn_tensor_v2);
SAME_SIZE(Qnn_Tensor_t, qnn_tensor);
SAME_OFFSET(Qnn_Tensor_t, v1, qnn_tensor, u.v1);
SAME_OFFSET(Qnn_ClientBuffer_t, dataSize, qnn_client_buf, size);

/* the interface table: every entry we call, and the header before it */
SAME_OFFSET(QnnInterface_t, providerName, qnn_interface, provider_name);
SAME_OFFSET(QnnInterface_t, apiVersion, qnn_interface, api_version);
SAME_OFFSET(QnnInterface_t, QNN_INTERFACE_VER_NAME, qnn_interface, t);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, backendCreate, qnn_interface_table, backend_create);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, backendGetApiVersion, qnn_interface_table, backend_get_api_version);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, backendFree, qnn_interface_table, backend_free);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, contextCreateFromBinary, qnn_interface_table, context_create_from_binary);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, contextFree, qnn_interface_table, context_free);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, graphRetrieve, qnn_interface_table, graph_retrieve);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, graphExecute, qnn_interface_table, graph_execute);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, logCreate, qnn_interface_table, log_create);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, logFree, qnn_interface_table, log_free);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, memRegister, qnn_interface_table, mem_register);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, deviceCreate, qnn_interface_table, device_create);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, deviceFree, qnn_interface_table, device_free);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, errorGetMessage, qnn_interface_table, error_get_message);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, graphGetProperty, qnn_interface_table, graph_get_property);
SAME_OFFSET(QnnDevice_Config_t, customConfig, qnn_device_config, custom);
/* the HTP device config's layout follows the HTP API version (qnn_abi.h) */
#if QNN_HTP_API_VERSION_MAJOR > 5 || (QNN_HTP_API_VERSION_MAJOR == 5 && QNN_HTP_API_VERSION_MINOR >= MA_QNN_HTP_DEVICE_CONFIG_PTR_MINOR)
SAME_SIZE(QnnHtpDevice_CustomConfig_t, qnn_htp_device_config_548);
SAME_OFFSET(QnnHtpDevice_CustomConfig_t, socModel, qnn_htp_device_config_548, u.soc_model);
SAME_OFFSET(QnnHtpDevice_CustomConfig_t, arch, qnn_htp_device_config_548, u.arch);
#else
SAME_SIZE(QnnHtpDevice_CustomConfig_t, qnn_htp_device_config);
SAME_OFFSET(QnnHtpDevice_CustomConfig_t, socModel, qnn_htp_device_config, u.soc_model);
SAME_OFFSET(QnnHtpDevice_CustomConfig_t, arch, qnn_htp_device_config, u.arch);
#endif

/* the system interface and binary info */
SAME_OFFSET(QnnSystemInterface_t, systemApiVersion, qnn_system_interface, api_version);
SAME_OFFSET(QnnSystemInterface_t, QNN_SYSTEM_INTERFACE_VER_NAME, qnn_system_interface, t);
SAME_OFFSET(QNN_SYSTEM_INTERFACE_VER_TYPE, systemContextCreate, qnn_system_table, context_create);
SAME_OFFSET(QNN_SYSTEM_INTERFACE_VER_TYPE, systemContextGetBinaryInfo, qnn_system_table, context_get_binary_info);
SAME_OFFSET(QNN_SYSTEM_INTERFACE_VER_TYPE, systemContextGetMetaData, qnn_system_table, context_get_metadata);
SAME_OFFSET(QNN_SYSTEM_INTERFACE_VER_TYPE, systemContextFree, qnn_system_table, context_free);
SAME_SIZE(QnnSystemContext_BinaryInfo_t, qnn_binary_info);
SAME_OFFSET(QnnSystemContext_BinaryInfo_t, contextBinaryInfoV1, qnn_binary_info, u.v1);
SAME_OFFSET(QnnSystemContext_BinaryInfoV1_t, buildId, qnn_binary_info_v1, build_id);
SAME_OFFSET(QnnSystemContext_BinaryInfoV1_t, coreApiVersion, qnn_binary_info_v1, core_api);
SAME_OFFSET(QnnSystemContext_BinaryInfoV1_t, socVersion, qnn_binary_info_v1, soc_version);
SAME_OFFSET(QnnSystemContext_BinaryInfoV1_t, numGraphs, qnn_binary_info_v1, n_graphs);
SAME_OFFSET(QnnSystemContext_BinaryInfoV1_t, graphs, qnn_binary_info_v1, graphs);
SAME_OFFSET(QnnSystemContext_BinaryInfoV2_t, numGraphs, qnn_binary_info_v1, n_graphs);
SAME_OFFSET(QnnSystemContext_BinaryInfoV2_t, graphs, qnn_binary_info_v1, graphs);
SAME_OFFSET(QnnSystemContext_BinaryInfoV2_t, platformInfo, qnn_binary_info_v1, platform_info);
/* every SDK's graph info array stride is the one chosen from its core API version */
_Static_assert(sizeof(QnnSystemContext_GraphInfo_t) ==
                   MA_QNN_GRAPH_STRIDE_V1 + (QNN_API_VERSION_MINOR >= 17) * 16 + (QNN_API_VERSION_MINOR >= 21) * 24,
               "sizeof(QnnSystemContext_GraphInfo_t) follows the core API version as ma_qnn_graph_stride says");
_Static_assert(sizeof(QnnSystemContext_GraphInfo_t) == (QNN_API_VERSION_MINOR <= 16   ? 48
                                                        : QNN_API_VERSION_MINOR <= 20 ? 64
                                                                                      : 88),
               "the graph info stride of this SDK");
SAME_OFFSET(QnnSystemContext_GraphInfo_t, graphInfoV1, qnn_graph_info, u.v1);
SAME_OFFSET(QnnSystemContext_GraphInfoV1_t, graphName, qnn_graph_info_v1, name);
SAME_OFFSET(QnnSystemContext_GraphInfoV1_t, numGraphInputs, qnn_graph_info_v1, n_inputs);
SAME_OFFSET(QnnSystemContext_GraphInfoV1_t, graphInputs, qnn_graph_info_v1, inputs);
SAME_OFFSET(QnnSystemContext_GraphInfoV1_t, numGraphOutputs, qnn_graph_info_v1, n_outputs);
SAME_OFFSET(QnnSystemContext_GraphInfoV1_t, graphOutputs, qnn_graph_info_v1, outputs);
#if QNN_API_VERSION_MINOR >= 21 /* SDK 2.28 and later: binary info and graph info version 3 */
SAME_VALUE(QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_3, 3);
SAME_VALUE(QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_3, 3);
SAME_OFFSET(QnnSystemContext_BinaryInfo_t, contextBinaryInfoV3, qnn_binary_info, u.v3);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, buildId, qnn_binary_info_v3, build_id);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, coreApiVersion, qnn_binary_info_v3, core_api);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, socVersion, qnn_binary_info_v3, soc_version);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, contextBlobVersion, qnn_binary_info_v3, context_blob_version);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, numGraphs, qnn_binary_info_v3, n_graphs);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, graphs, qnn_binary_info_v3, graphs);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, contextMetadataSize, qnn_binary_info_v3, metadata_size);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, contextMetadata, qnn_binary_info_v3, metadata);
SAME_OFFSET(QnnSystemContext_BinaryInfoV3_t, socModel, qnn_binary_info_v3, soc_model);
SAME_SIZE(QnnSystemContext_GraphInfoV3_t, qnn_graph_info_v3);
SAME_OFFSET(QnnSystemContext_GraphInfoV3_t, graphName, qnn_graph_info_v3, v1.name);
SAME_OFFSET(QnnSystemContext_GraphInfoV3_t, graphOutputs, qnn_graph_info_v3, v1.outputs);
SAME_OFFSET(QnnSystemContext_GraphInfoV3_t, numUpdateableTensors, qnn_graph_info_v3, n_updateable);
SAME_OFFSET(QnnSystemContext_GraphInfoV3_t, graphBlobInfo, qnn_graph_info_v3, blob_info);
SAME_OFFSET(QnnSystemContext_GraphInfoV3_t, startOpIndex, qnn_graph_info_v3, first_op);
SAME_SIZE(QnnSystemContext_GraphInfo_t, qnn_graph_info);
#endif

/* errors we act on */
SAME_VALUE(QNN_COMMON_ERROR_SYSTEM_COMMUNICATION, QNN_ERR_COMMON_SYSTEM_COMMUNICATION);
SAME_VALUE(QNN_CONTEXT_ERROR_CREATE_FROM_BINARY, QNN_ERR_CONTEXT_CREATE_FROM_BINARY);
SAME_VALUE(QNN_GRAPH_ERROR_GRAPH_DOES_NOT_EXIST, QNN_ERR_GRAPH_DOES_NOT_EXIST);
#if QNN_API_VERSION_MINOR >= 18
SAME_VALUE(QNN_COMMON_ERROR_SYSTEM_COMMUNICATION_FATAL, QNN_ERR_COMMON_SYSTEM_COMMUNICATION_FATAL);
#endif

/* zero-copy: the memory descriptor and the ION type */
SAME_SIZE(Qnn_MemDescriptor_t, qnn_mem_descriptor);
SAME_OFFSET(Qnn_MemDescriptor_t, dataType, qnn_mem_descriptor, data_type);
SAME_OFFSET(Qnn_MemDescriptor_t, memType, qnn_mem_descriptor, mem_type);
SAME_OFFSET(Qnn_MemDescriptor_t, ionInfo, qnn_mem_descriptor, u.ion_fd);
SAME_VALUE(QNN_MEM_TYPE_ION, QNN_MEMTYPE_ION);
SAME_VALUE(QNN_TENSORMEMTYPE_MEMHANDLE, QNN_MEM_HANDLE);
SAME_OFFSET(Qnn_TensorV1_t, memHandle, qnn_tensor_v1, buf.mem);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, memDeRegister, qnn_interface_table, mem_deregister);
SAME_OFFSET(QNN_INTERFACE_VER_TYPE, deviceGetInfrastructure, qnn_interface_table, device_get_infrastructure);

/* the HTP power vote */
SAME_SIZE(QnnHtpDevice_Infrastructure_t, qnn_htp_infrastructure);
SAME_OFFSET(QnnHtpDevice_Infrastructure_t, perfInfra, qnn_htp_infrastructure, create_power_config_id);
_Static_assert(offsetof(QnnHtpDevice_Infrastructure_t, perfInfra) + offsetof(QnnHtpDevice_PerfInfrastructure_t, setPowerConfig) ==
                   offsetof(qnn_htp_infrastructure, set_power_config),
               "setPowerConfig is at our set_power_config");
_Static_assert(offsetof(QnnHtpDevice_Infrastructure_t, perfInfra) + offsetof(QnnHtpDevice_PerfInfrastructure_t, destroyPowerConfigId) ==
                   offsetof(qnn_htp_infrastructure, destroy_power_config_id),
               "destroyPowerConfigId is at our destroy_power_config_id");
SAME_SIZE(QnnHtpPerfInfrastructure_PowerConfig_t, qnn_htp_power_config);
SAME_OFFSET(QnnHtpPerfInfrastructure_PowerConfig_t, dcvsV3Config, qnn_htp_power_config, u.dcvs);
SAME_OFFSET(QnnHtpPerfInfrastructure_PowerConfig_t, rpcControlLatencyConfig, qnn_htp_power_config, u.rpc_control_latency_us);
SAME_OFFSET(QnnHtpPerfInfrastructure_PowerConfig_t, rpcPollingTimeConfig, qnn_htp_power_config, u.rpc_polling_time_us);
SAME_OFFSET(QnnHtpPerfInfrastructure_DcvsV3_t, sleepLatency, qnn_htp_dcvs_v3, sleep_latency_us);
SAME_OFFSET(QnnHtpPerfInfrastructure_DcvsV3_t, coreVoltageCornerMax, qnn_htp_dcvs_v3, core_corner_max);
SAME_VALUE(QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_DCVS_V3, QNN_HTP_POWER_DCVS_V3);
SAME_VALUE(QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_RPC_CONTROL_LATENCY, QNN_HTP_POWER_RPC_CONTROL_LATENCY);
SAME_VALUE(QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_RPC_POLLING_TIME, QNN_HTP_POWER_RPC_POLLING_TIME);
SAME_VALUE(QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_PERFORMANCE_MODE, QNN_HTP_POWER_MODE_PERFORMANCE);
SAME_VALUE(DCVS_VOLTAGE_VCORNER_TURBO, QNN_HTP_CORNER_TURBO);
SAME_VALUE(DCVS_VOLTAGE_VCORNER_MAX_VOLTAGE_CORNER, QNN_HTP_CORNER_MAX);
SAME_VALUE(QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET, QNN_QENC_AXIS_SCALE_OFFSET);
SAME_VALUE(QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET, QNN_QENC_BW_AXIS_SCALE_OFFSET);
#if QNN_API_VERSION_MINOR >= 18
SAME_VALUE(QNN_QUANTIZATION_ENCODING_BLOCK, QNN_QENC_BLOCK);
SAME_VALUE(QNN_QUANTIZATION_ENCODING_VECTOR, QNN_QENC_VECTOR);
#endif

int ma_qnn_layout_checked(void);
int ma_qnn_layout_checked(void) { return 1; }
