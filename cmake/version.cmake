# Writes OUT (crl_version.h: the commit colocated-rl --version names) when it changed, so a build
# recompiles only what includes it, and only after a commit:
#   cmake -DSRC=... -DOUT=... -DVERSION=... -DBUILD_TYPE=... -P version.cmake
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
endif()
string(CONCAT text "#pragma once\n#define CRL_GIT_COMMIT \"${commit}\"\n#define CRL_VERSION \"${VERSION}\"\n"
       "#define CRL_BUILD_TYPE \"${BUILD_TYPE}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
