/* A simulated libnvidia-ml.so.1: NVML's C signatures over a node described in a text file.
 *
 * Built at test time (`cc -shared -fPIC`, tests/simnvml.py) and loaded by the real pynvml
 * (nvidia-ml-py) in place of the driver's library, so the plugin runs through pynvml's own ctypes
 * structures, error classes and function lookup. Only this file is not NVIDIA's.
 *
 * The node is read at nvmlInit_v2/nvmlInitWithFlags from the file named by $SIM_NVML_NODE, one
 * record a line (fields separated by single spaces, the name last so it may hold spaces):
 *   driver <version> <cuda version as int, e.g. 12080>
 *   gpu <uuid> <cc major> <cc minor> <architecture> <memory bytes> <power mW> <limit mW>
 *       <energy at init mJ> <instant: 0 absent, 1 uint mW, 2 double mW, 3 fails when read> <pci bus id> <name>
 *   mig <parent gpu index> <uuid> <gpu instance id> <compute instance id> <memory bytes> <name>
 * Energy grows at the GPU's power from nvmlInit on (CLOCK_MONOTONIC); a MIG device has no power or
 * energy of its own (NOT_SUPPORTED), as on real A100/H100 MIG handles.
 *
 * Compiled with -DSIM_NO_ARCHITECTURE, nvmlDeviceGetArchitecture is not exported: a driver
 * old enough to lack it, where pynvml raises NVMLError_FunctionNotFound.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_UNKNOWN = 999,
};
enum { NVML_VALUE_TYPE_DOUBLE = 0, NVML_VALUE_TYPE_UNSIGNED_INT = 1 };
#define NVML_FI_DEV_POWER_INSTANT 186

#define MAX_GPUS 16
#define MAX_MIGS 7

typedef struct sim_device sim_device;
struct sim_device {
    int is_mig;
    sim_device *parent;
    char uuid[96], name[96], bus_id[32];
    int cc_major, cc_minor;
    unsigned int arch, limit_mw, instant_mode, gi, ci;
    unsigned long long memory, power_mw, energy0_mj;
    sim_device *migs[MAX_MIGS];
    unsigned int mig_count;
};

static sim_device gpus[MAX_GPUS];
static sim_device migs[MAX_GPUS * MAX_MIGS];
static unsigned int gpu_count, mig_total, init_count;
static char driver[80] = "535.104.05";
static int cuda_version = 12020;
static double started;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void copy_rest(char *out, size_t size, const char *rest) {
    snprintf(out, size, "%s", rest);
    out[strcspn(out, "\n")] = 0;
}

static nvmlReturn_t load_node(void) {
    const char *path = getenv("SIM_NVML_NODE");
    FILE *file = path ? fopen(path, "r") : NULL;
    char line[512];
    int used;
    if (!file) return NVML_ERROR_UNKNOWN;
    gpu_count = mig_total = 0;
    while (fgets(line, sizeof line, file)) {
        if (strncmp(line, "driver ", 7) == 0) {
            sscanf(line + 7, "%79s %d", driver, &cuda_version);
        } else if (strncmp(line, "gpu ", 4) == 0 && gpu_count < MAX_GPUS) {
            sim_device *g = &gpus[gpu_count];
            memset(g, 0, sizeof *g);
            if (sscanf(line + 4, "%95s %d %d %u %llu %llu %u %llu %u %31s %n", g->uuid, &g->cc_major, &g->cc_minor,
                       &g->arch, &g->memory, &g->power_mw, &g->limit_mw, &g->energy0_mj, &g->instant_mode,
                       g->bus_id, &used) < 10)
                continue;
            copy_rest(g->name, sizeof g->name, line + 4 + used);
            gpu_count++;
        } else if (strncmp(line, "mig ", 4) == 0 && mig_total < MAX_GPUS * MAX_MIGS) {
            sim_device *m = &migs[mig_total];
            unsigned int parent;
            memset(m, 0, sizeof *m);
            if (sscanf(line + 4, "%u %95s %u %u %llu %n", &parent, m->uuid, &m->gi, &m->ci, &m->memory, &used) < 5 ||
                parent >= gpu_count || gpus[parent].mig_count >= MAX_MIGS)
                continue;
            copy_rest(m->name, sizeof m->name, line + 4 + used);
            m->is_mig = 1;
            m->parent = &gpus[parent];
            gpus[parent].migs[gpus[parent].mig_count++] = m;
            mig_total++;
        }
    }
    fclose(file);
    return NVML_SUCCESS;
}

static int valid(sim_device *d) {
    if (!init_count || !d) return 0;
    return (d >= gpus && d < gpus + gpu_count) || (d >= migs && d < migs + mig_total);
}

#define DEVICE(d)                                          \
    do {                                                   \
        if (!init_count) return NVML_ERROR_UNINITIALIZED;  \
        if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT; \
    } while (0)

static nvmlReturn_t put_text(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (init_count == 0) {
        nvmlReturn_t ret = load_node();
        if (ret != NVML_SUCCESS) return ret;
        started = now();
    }
    init_count++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    init_count--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    return put_text(driver, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, sim_device **device) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (index >= gpu_count || !device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

/* Takes GPU-... and MIG-... UUIDs (NVML does from R470 on). */
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, sim_device **device) {
    unsigned int i;
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < gpu_count; i++)
        if (strcmp(gpus[i].uuid, uuid) == 0) return *device = &gpus[i], NVML_SUCCESS;
    for (i = 0; i < mig_total; i++)
        if (strcmp(migs[i].uuid, uuid) == 0) return *device = &migs[i], NVML_SUCCESS;
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetName(sim_device *d, char *name, unsigned int length) {
    DEVICE(d);
    return put_text(d->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(sim_device *d, char *uuid, unsigned int length) {
    DEVICE(d);
    return put_text(d->uuid, uuid, length);
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(sim_device *d, nvmlPciInfo_t *pci) {
    DEVICE(d);
    sim_device *g = d->is_mig ? d->parent : d;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", g->bus_id + 4);
    sscanf(g->bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    return NVML_SUCCESS;
}

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo(sim_device *d, nvmlMemory_t *memory) {
    DEVICE(d);
    memory->total = d->memory;
    memory->used = 0;
    memory->free = d->memory;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(sim_device *d, int *major, int *minor) {
    DEVICE(d);
    sim_device *g = d->is_mig ? d->parent : d;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

#ifndef SIM_NO_ARCHITECTURE
nvmlReturn_t nvmlDeviceGetArchitecture(sim_device *d, unsigned int *arch) {
    DEVICE(d);
    *arch = (d->is_mig ? d->parent : d)->arch;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(sim_device *d, unsigned int *limit) {
    DEVICE(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *limit = d->limit_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(sim_device *d, unsigned int *power) {
    DEVICE(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *power = (unsigned int)d->power_mw;
    return NVML_SUCCESS;
}

/* Volta (5) and newer only, as NVML documents. */
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(sim_device *d, unsigned long long *energy) {
    DEVICE(d);
    if (d->is_mig || d->arch < 5) return NVML_ERROR_NOT_SUPPORTED;
    *energy = d->energy0_mj + (unsigned long long)((double)d->power_mw * (now() - started));
    return NVML_SUCCESS;
}

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

nvmlReturn_t nvmlDeviceGetFieldValues(sim_device *d, int count, nvmlFieldValue_t *values) {
    int i;
    DEVICE(d);
    for (i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)(now() * 1e6);
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof v->value);
        if (v->fieldId != NVML_FI_DEV_POWER_INSTANT || d->is_mig || d->instant_mode == 0) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (d->instant_mode == 3 && now() - started > 0.05) {
            v->nvmlReturn = NVML_ERROR_UNKNOWN; /* supported when probed, then failing */
        } else if (d->instant_mode == 2) {
            v->nvmlReturn = NVML_SUCCESS;
            v->valueType = NVML_VALUE_TYPE_DOUBLE;
            v->value.dVal = (double)d->power_mw;
        } else {
            v->nvmlReturn = NVML_SUCCESS;
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = (unsigned int)d->power_mw;
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(sim_device *d, unsigned int *current, unsigned int *pending) {
    DEVICE(d);
    if (d->is_mig || d->arch < 7) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = d->mig_count > 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(sim_device *d, unsigned int *count) {
    DEVICE(d);
    if (d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *count = d->mig_count ? MAX_MIGS : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(sim_device *d, unsigned int index, sim_device **mig) {
    DEVICE(d);
    if (d->is_mig || index >= MAX_MIGS) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= d->mig_count) return NVML_ERROR_NOT_FOUND;
    *mig = d->migs[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(sim_device *d, unsigned int *is_mig) {
    DEVICE(d);
    *is_mig = (unsigned int)d->is_mig;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(sim_device *d, sim_device **parent) {
    DEVICE(d);
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = d->parent;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(sim_device *d, unsigned int *id) {
    DEVICE(d);
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(sim_device *d, unsigned int *id) {
    DEVICE(d);
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->ci;
    return NVML_SUCCESS;
}

/* Not NVML: lets a test start from a clean library after one that leaked an nvmlInit. */
void simnvml_reset(void) { init_count = 0; }
