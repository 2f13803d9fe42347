/* A simulated libnvidia-ml.so.1: NVML's C signatures over a node described in a text file.
 *
 * Built at test time (`cc -shared -fPIC`, tests/simnvml.py) and loaded by the real pynvml
 * (nvidia-ml-py) in place of the driver's library, so the plugin runs through pynvml's own ctypes
 * structures, error classes and function lookup. Only this file is not NVIDIA's.
 *
 * The node is read at nvmlInit_v2/nvmlInitWithFlags from the file named by $SIM_NVML_NODE, one
 * record a line (fields separated by single spaces, the name last so it may hold spaces):
 *   driver <version> <cuda version as int, e.g. 12080>
 *   gpu <uuid> <cc major> <cc minor> <architecture> <memory bytes> <power mW> <limit mW, 0: not supported>
 *       <energy at driver load mJ> <instant: 0 absent, 1 uint mW, 2 double mW, 3 fails after the first read>
 *       <power ramp mW/s> <counter scale> <pci bus id> <name>
 *   mig <parent gpu index> <uuid> <gpu instance id> <compute instance id> <memory bytes> <name>
 * The driver "loads" at the first nvmlInit after the library is loaded or simnvml_reset(): power is
 * <power> + <ramp> x (seconds since then), and energy grows as its integral (CLOCK_MONOTONIC, or the
 * test's simulated time once simnvml_set_time is called), times
 * <counter scale> (1 for an honest counter). A MIG device has no power or energy of its own
 * (NOT_SUPPORTED), as on real A100/H100 MIG handles.
 *
 * Compiled with -DSIM_NO_ARCHITECTURE, nvmlDeviceGetArchitecture is not exported: a driver
 * old enough to lack it, where pynvml raises NVMLError_FunctionNotFound.
 *
 * Tests steer and watch the library through functions NVML does not have, all named simnvml_*
 * (called through ctypes): simnvml_reset, simnvml_lose_gpu, simnvml_set_time, simnvml_init_calls,
 * simnvml_shutdown_calls.
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
    NVML_ERROR_GPU_IS_LOST = 15,
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
    double ramp_mw_per_s, counter_scale;
    sim_device *migs[MAX_MIGS];
    unsigned int mig_count;
};

static sim_device gpus[MAX_GPUS];
static sim_device migs[MAX_GPUS * MAX_MIGS];
static unsigned int gpu_count, mig_total, init_count;
static char driver[80] = "535.104.05";
static int cuda_version = 12020;
static int driver_loaded;
static double started; /* when the driver "loaded": the origin of the power ramp and the counters */
/* Kept apart from gpus[], which load_node rewrites at every first nvmlInit: a lost GPU stays lost
 * until the driver reloads (here, simnvml_reset). */
static int lost[MAX_GPUS];
static unsigned int instant_reads[MAX_GPUS]; /* for INSTANT mode 3, since the driver loaded */
static unsigned int init_calls, shutdown_calls;

/* Set by simnvml_set_time: the test's simulated time stands in for CLOCK_MONOTONIC. */
static volatile int time_is_set;
static volatile double time_set;

static double now(void) {
    struct timespec t;
    if (time_is_set) return time_set;
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
            if (sscanf(line + 4, "%95s %d %d %u %llu %llu %u %llu %u %lf %lf %31s %n", g->uuid, &g->cc_major,
                       &g->cc_minor, &g->arch, &g->memory, &g->power_mw, &g->limit_mw, &g->energy0_mj,
                       &g->instant_mode, &g->ramp_mw_per_s, &g->counter_scale, g->bus_id, &used) < 12)
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

static int is_lost(sim_device *d) { return lost[(d->is_mig ? d->parent : d) - gpus]; }

/* Every device query the plugin makes lists NVML_ERROR_GPU_IS_LOST "if the target GPU has fallen off
 * the bus or is otherwise inaccessible" among its returns (NVML API reference, Device Queries:
 * nvmlDeviceGetName, GetUUID, GetPowerUsage, GetTotalEnergyConsumption, GetEnforcedPowerLimit, ...);
 * a MIG device is lost with its GPU. */
#define DEVICE(d)                                          \
    do {                                                   \
        if (!init_count) return NVML_ERROR_UNINITIALIZED;  \
        if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT; \
        if (is_lost(d)) return NVML_ERROR_GPU_IS_LOST;     \
    } while (0)

static double since_load(void) { return now() - started; }

static double power_mw_now(sim_device *g) {
    double p = (double)g->power_mw + g->ramp_mw_per_s * since_load();
    return p > 0 ? p : 0;
}

static nvmlReturn_t put_text(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

/* nvmlInit_v2: "A reference count of the number of initializations is maintained. Shutdown only
 * occurs when the reference count reaches zero." (nvml.h). The counts of successful calls are the
 * tests' check that every user that opens NVML closes it. */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (init_count == 0) {
        nvmlReturn_t ret = load_node();
        if (ret != NVML_SUCCESS) return ret;
        if (!driver_loaded) started = now(), driver_loaded = 1;
    }
    init_count++;
    init_calls++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    init_count--;
    shutdown_calls++;
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
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
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

/* NVML_ERROR_GPU_IS_LOST "if the target GPU has fallen off the bus or is otherwise inaccessible"
 * (NVML API reference, nvmlDeviceGetHandleByIndex_v2). */
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, sim_device **device) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (index >= gpu_count || !device) return NVML_ERROR_INVALID_ARGUMENT;
    if (lost[index]) return NVML_ERROR_GPU_IS_LOST;
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

/* NVML_ERROR_NOT_SUPPORTED "if the device does not support this feature" (NVML API reference,
 * nvmlDeviceGetEnforcedPowerLimit): a limit of 0 in the node file. */
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(sim_device *d, unsigned int *limit) {
    DEVICE(d);
    if (d->is_mig || d->limit_mw == 0) return NVML_ERROR_NOT_SUPPORTED;
    *limit = d->limit_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(sim_device *d, unsigned int *power) {
    DEVICE(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *power = (unsigned int)power_mw_now(d);
    return NVML_SUCCESS;
}

/* Volta (5) and newer only, as NVML documents; "total energy consumption for this GPU in millijoules
 * (mJ) since the driver was last reloaded" (nvml.h): the integral of the power above since load.
 * A counter scale other than 1 is a counter that disagrees with the power readings, which NVML does
 * not promise to agree (nvmlDeviceGetPowerUsage: "On Fermi and Kepler GPUs the reading is accurate to
 * within +/- 5% of current power draw", nothing said for later ones), i.e. what the meter's
 * counter-against-sampled-power cross-check is there to catch. */
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(sim_device *d, unsigned long long *energy) {
    double t, integral_mj;
    DEVICE(d);
    if (d->is_mig || d->arch < 5) return NVML_ERROR_NOT_SUPPORTED;
    t = since_load();
    integral_mj = (double)d->power_mw * t + d->ramp_mw_per_s * t * t / 2;
    *energy = d->energy0_mj + (unsigned long long)(d->counter_scale * integral_mj);
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

/* Past the library's own state, the call answers only NVML_SUCCESS ("if any values in values were
 * populated. Note that you must check the nvmlReturn field of each value for each individual
 * status") or NVML_ERROR_INVALID_ARGUMENT (NVML API reference, nvmlDeviceGetFieldValues), so a lost
 * GPU's failure is in each value's nvmlReturn. */
nvmlReturn_t nvmlDeviceGetFieldValues(sim_device *d, int count, nvmlFieldValue_t *values) {
    int i;
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !values) return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)(now() * 1e6);
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof v->value);
        if (is_lost(d)) {
            v->nvmlReturn = NVML_ERROR_GPU_IS_LOST;
        } else if (v->fieldId != NVML_FI_DEV_POWER_INSTANT || d->is_mig || d->instant_mode == 0) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (d->instant_mode == 3 && instant_reads[d - gpus]++ > 0) {
            v->nvmlReturn = NVML_ERROR_UNKNOWN; /* supported when probed (the first read), then failing */
        } else if (d->instant_mode == 2) {
            v->nvmlReturn = NVML_SUCCESS;
            v->valueType = NVML_VALUE_TYPE_DOUBLE;
            v->value.dVal = power_mw_now(d);
        } else {
            v->nvmlReturn = NVML_SUCCESS;
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = (unsigned int)power_mw_now(d);
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

/* Not NVML: lets a test start from a clean library after one that leaked an nvmlInit; the driver
 * "reloads" at the next nvmlInit (counters from their value at load, no GPU lost). */
void simnvml_reset(void) {
    init_count = init_calls = shutdown_calls = 0;
    driver_loaded = 0;
    time_is_set = 0;
    memset(lost, 0, sizeof lost);
    memset(instant_reads, 0, sizeof instant_reads);
}

/* Not NVML: the library's clock reads `seconds` from now on, until the next call or simnvml_reset:
 * a test's simulated time (tests/simnvml.py, simulated_time), so power and energy follow it alone. */
void simnvml_set_time(double seconds) {
    time_set = seconds;
    time_is_set = 1;
}

/* Not NVML: the GPU at this index falls off the bus now; from here on NVML answers
 * NVML_ERROR_GPU_IS_LOST for it (see DEVICE), as the driver does until it is reloaded. */
void simnvml_lose_gpu(unsigned int index) {
    if (index < MAX_GPUS) lost[index] = 1;
}

/* Not NVML: successful nvmlInitWithFlags (nvmlInit_v2) and nvmlShutdown calls since the last simnvml_reset. */
unsigned int simnvml_init_calls(void) { return init_calls; }
unsigned int simnvml_shutdown_calls(void) { return shutdown_calls; }
