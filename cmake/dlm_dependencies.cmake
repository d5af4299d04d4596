# Every third-party library dlm uses, found once here (all from Debian's packages; see scripts/setup.sh).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(simdjson REQUIRED)
find_package(zstd REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(MPI REQUIRED COMPONENTS C)
# dlm uses MPI's C API from C++: keep the deprecated C++ bindings (and their link needs) out.
set_property(TARGET MPI::MPI_C APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# Gloo (libgloo-dev): the CPU collectives of ranks started by torchrun, where no MPI world exists. Optional:
# without it dlm-train refuses torchrun on the CPU with one line.
find_package(Gloo CONFIG QUIET)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)

if(TARGET zstd::libzstd_shared)
  set(DLM_ZSTD zstd::libzstd_shared)
else()
  set(DLM_ZSTD zstd::libzstd_static)
endif()
