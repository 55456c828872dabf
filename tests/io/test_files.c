/* SPDX-License-Identifier: Apache-2.0 */
/* Output files (ma_outfile, ma_write_file) and input files (ma_map_file, ma_read_file) against
 * what a careless or hostile user hands them: device nodes, FIFOs, symlinks, directories, empty
 * paths, a full device, and a mapped file truncated while in use. Device nodes are made with
 * mknod in a temporary directory (never the machine's own /dev/null or /dev/full). */
#define _GNU_SOURCE
#include "../test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

static char dir[1024];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

static int only_entries(int want) {
    int n = -1; /* count entries of dir (not . and ..): no stray temporary file */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq %d", dir, want);
    n = system(cmd);
    return n == 0;
}

static void test_regular_and_new_files_replaced_atomically(void **state) {
    (void)state;
    char p[1200];
    ma_error err = {0};
    tu_tmpdir(dir, sizeof dir, "files-regular");
    path_in(p, sizeof p, "a.bin");
    assert_int_equal(ma_write_file(p, "hello", 5, &err), MA_OK);
    chmod(p, 0640);
    assert_int_equal(ma_write_file(p, "bye", 3, &err), MA_OK);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, 3);
    assert_int_equal(st.st_mode & 0777, 0640); /* the replaced file's mode is kept */
    assert_true(only_entries(1));
    /* a directory, an empty path, a missing parent: refused with the reason */
    assert_fails_naming(ma_write_file(dir, "x", 1, &err), err, "Is a directory");
    assert_fails_naming(ma_write_file("", "x", 1, &err), err, "empty output path");
    path_in(p, sizeof p, "missing/x.bin");
    assert_fails_naming(ma_write_file(p, "x", 1, &err), err, "No such file or directory");
    assert_true(strstr(err.msg, "missing/x.bin") != NULL);
    tu_rmdir(dir);
}

static void test_symlinks_followed_to_their_target(void **state) {
    (void)state;
    char target[1200], link[1200], dangling[1200], newt[1200];
    ma_error err = {0};
    tu_tmpdir(dir, sizeof dir, "files-links");
    path_in(target, sizeof target, "target.bin");
    path_in(link, sizeof link, "link.bin");
    assert_int_equal(ma_write_file(target, "old", 3, &err), MA_OK);
    assert_int_equal(symlink("target.bin", link), 0);
    assert_int_equal(ma_write_file(link, "new!", 4, &err), MA_OK);
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode)); /* still a link */
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_size, 4); /* its target was written */
    /* a dangling link creates its target */
    path_in(dangling, sizeof dangling, "dangling.bin");
    path_in(newt, sizeof newt, "created.bin");
    assert_int_equal(symlink("created.bin", dangling), 0);
    assert_int_equal(ma_write_file(dangling, "x", 1, &err), MA_OK);
    assert_int_equal(lstat(dangling, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(stat(newt, &st), 0);
    assert_true(only_entries(4));
    /* a loop is refused */
    char a[1200], b[1200];
    path_in(a, sizeof a, "loop-a");
    path_in(b, sizeof b, "loop-b");
    assert_int_equal(symlink("loop-b", a), 0);
    assert_int_equal(symlink("loop-a", b), 0);
    assert_fails_naming(ma_write_file(a, "x", 1, &err), err, "loop-a");
    tu_rmdir(dir);
}

static void test_devices_and_fifos_written_in_place(void **state) {
    (void)state;
    char null_dev[1200], full_dev[1200], fifo[1200], link[1200];
    ma_error err = {0};
    tu_tmpdir(dir, sizeof dir, "files-devices");
    path_in(null_dev, sizeof null_dev, "null");
    path_in(full_dev, sizeof full_dev, "full");
    path_in(link, sizeof link, "out.npz");
    if (mknod(null_dev, S_IFCHR | 0666, makedev(1, 3)) != 0 || mknod(full_dev, S_IFCHR | 0666, makedev(1, 7)) != 0) {
        tu_rmdir(dir);
        skip(); /* no CAP_MKNOD here */
    }
    /* opening the node must work (a nodev mount refuses it) */
    int probe = open(null_dev, O_WRONLY);
    if (probe < 0) {
        tu_rmdir(dir);
        skip();
    }
    close(probe);
    struct stat st;
    assert_int_equal(ma_write_file(null_dev, "data", 4, &err), MA_OK);
    assert_int_equal(stat(null_dev, &st), 0);
    assert_true(S_ISCHR(st.st_mode)); /* still the device, not a regular file */
    assert_true(only_entries(2));
    /* the full device: ENOSPC, naming it */
    static char big[1 << 16];
    assert_fails_naming(ma_write_file(full_dev, big, sizeof big, &err), err, "No space left on device");
    assert_true(strstr(err.msg, full_dev) != NULL);
    assert_int_equal(stat(full_dev, &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    /* a symlink to a device writes the device */
    assert_int_equal(symlink("null", link), 0);
    assert_int_equal(ma_write_file(link, "x", 1, &err), MA_OK);
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    /* a FIFO without a reader is refused at once; with one, it is written in place */
    path_in(fifo, sizeof fifo, "fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_fails_naming(ma_write_file(fifo, "x", 1, &err), err, "no reader");
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(fifo, O_RDONLY);
        char b[16];
        ssize_t n = read(fd, b, sizeof b);
        _exit(n == 5 && !memcmp(b, "fifo!", 5) ? 0 : 1);
    }
    for (int tries = 0; tries < 500; tries++) { /* until the reader has the FIFO open */
        if (ma_write_file(fifo, "fifo!", 5, &err) == MA_OK) break;
        usleep(10000);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(stat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    tu_rmdir(dir);
}

static void test_inputs_that_are_not_regular_files(void **state) {
    (void)state;
    char fifo[1200];
    ma_error err = {0};
    tu_tmpdir(dir, sizeof dir, "files-inputs");
    path_in(fifo, sizeof fifo, "in.npz");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    ma_mapfile m;
    char *buf;
    /* a FIFO with no writer: refused at once (open() used to block forever) */
    assert_fails_naming(ma_map_file(&m, fifo, &err), err, "not a regular file");
    assert_fails_naming(ma_read_file(fifo, 100, &buf, NULL, &err), err, "not a regular file");
    assert_fails_naming(ma_map_file(&m, dir, &err), err, "a directory");
    tu_rmdir(dir);
}

static void test_truncated_mapping_reported_not_fatal(void **state) {
    (void)state;
    char p[1200];
    ma_error err = {0};
    tu_tmpdir(dir, sizeof dir, "files-sigbus");
    path_in(p, sizeof p, "weights.bin");
    const size_t n = 1 << 20;
    char *data = malloc(n);
    memset(data, 7, n);
    assert_int_equal(ma_write_file(p, data, n, &err), MA_OK);
    free(data);
    ma_mapfile m;
    assert_int_equal(ma_map_file(&m, p, &err), MA_OK);
    assert_int_equal(ma_mapfile_check(&err), MA_OK);
    assert_int_equal(truncate(p, 4096), 0);
    /* reading past the new end faulted with SIGBUS (exit 135); now it reads zeros and is marked */
    volatile long sum = 0;
    for (size_t i = 0; i < n; i += 4096) sum += m.data[i];
    assert_int_equal(sum, 7);
    assert_fails_naming(ma_mapfile_check(&err), err, "weights.bin: the file was truncated or changed on disk");
    ma_unmap_file(&m);
    assert_int_equal(ma_mapfile_check(&err), MA_OK); /* an unmapped file no longer counts */
    tu_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regular_and_new_files_replaced_atomically), cmocka_unit_test(test_symlinks_followed_to_their_target),
        cmocka_unit_test(test_devices_and_fifos_written_in_place),        cmocka_unit_test(test_inputs_that_are_not_regular_files),
        cmocka_unit_test(test_truncated_mapping_reported_not_fatal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
