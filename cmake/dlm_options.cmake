# Compiler warnings and sanitizer flags shared by every dlm target.
add_library(dlm_warnings INTERFACE)
target_compile_options(dlm_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>)
install(TARGETS dlm_warnings EXPORT dlmTargets)

if(DLM_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=address,undefined)
endif()
if(DLM_FUZZ)
  # Coverage instrumentation for every library the fuzz targets link (the targets add -fsanitize=fuzzer).
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
if(DLM_TSAN)
  add_compile_options(-fsanitize=thread -g)
  add_link_options(-fsanitize=thread)
endif()

# dlm_add_library(NAME ALIAS SOURCES...): a library exported as dlm::ALIAS.
function(dlm_add_library name alias)
  add_library(${name} ${ARGN})
  add_library(dlm::${alias} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${alias} OUTPUT_NAME dlm_${alias})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${name} PRIVATE $<BUILD_INTERFACE:dlm_warnings>)
  install(TARGETS ${name} EXPORT dlmTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# dlm_add_tool(NAME SOURCES... LIBS ...): an installed command-line tool.
function(dlm_add_tool name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} dlm_warnings)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tools)
  install(TARGETS ${name} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()
