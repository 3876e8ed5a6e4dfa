/* LD_PRELOAD shim that counts frames returned by FFmpeg's avcodec_receive_frame().
 *
 * The benchmark harness runs every driver (this project's loader, LeRobot's map-style and
 * streaming datasets) with this library preloaded, so "decoded frames" is counted the same
 * way for PyAV (bundled FFmpeg) and torchcodec (system FFmpeg), in the driver process and in
 * all of its DataLoader workers (fork or spawn: the environment is inherited).
 *
 * The count lives in a shared file named by $LRN_DECODE_COUNTER_FILE (8 bytes, mmap'ed
 * MAP_SHARED, atomically incremented), so the harness reads one total for a whole process tree.
 *
 * Several FFmpeg builds may be loaded in one process; each call is forwarded to the
 * avcodec_receive_frame that the *calling* object would have bound to (looked up in the
 * caller's own dependency tree), never to another copy.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*receive_fn)(void *avctx, void *frame);

#define MAX_CALLERS 32
static struct {
    void *caller_map;
    receive_fn real;
} resolved[MAX_CALLERS];
static int n_resolved;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *counter;
static int counter_state; /* 0 = not tried, 1 = mapped, -1 = unavailable */

int avcodec_receive_frame(void *avctx, void *frame);

static void map_counter(void) {
    const char *path = getenv("LRN_DECODE_COUNTER_FILE");
    counter_state = -1;
    if (path == NULL || *path == '\0') return;
    int fd = open(path, O_RDWR);
    if (fd < 0) return;
    void *mem = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) return;
    counter = (uint64_t *)mem;
    counter_state = 1;
}

static receive_fn resolve(void *return_address) {
    Dl_info info;
    struct link_map *map = NULL;
    if (dladdr1(return_address, &info, (void **)&map, RTLD_DL_LINKMAP) == 0 || map == NULL) map = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_resolved; i++) {
        if (resolved[i].caller_map == map) {
            receive_fn fn = resolved[i].real;
            pthread_mutex_unlock(&lock);
            return fn;
        }
    }
    receive_fn fn = NULL;
    if (map != NULL) {
        void *handle = dlopen(map->l_name[0] ? map->l_name : NULL, RTLD_LAZY | RTLD_NOLOAD);
        if (handle != NULL) {
            fn = (receive_fn)dlsym(handle, "avcodec_receive_frame");
            dlclose(handle);
        }
    }
    if (fn == NULL || fn == avcodec_receive_frame) fn = (receive_fn)dlsym(RTLD_NEXT, "avcodec_receive_frame");
    if (fn != NULL && n_resolved < MAX_CALLERS) {
        resolved[n_resolved].caller_map = map;
        resolved[n_resolved].real = fn;
        n_resolved++;
    }
    if (counter_state == 0) map_counter();
    pthread_mutex_unlock(&lock);
    return fn;
}

__attribute__((noinline)) int avcodec_receive_frame(void *avctx, void *frame) {
    receive_fn real = resolve(__builtin_return_address(0));
    if (real == NULL) abort();
    int ret = real(avctx, frame);
    if (ret == 0 && counter_state == 1) __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
    return ret;
}
