# A registry: the table of one kind of thing (layer types, optimizers, schedules, store backends),
# written at build time from the files of its folder, so that a new one is one file there and no
# list anywhere names it. Each file defines its rows as functions `ROW name() {` at the start of a
# line, or through MACRO as `MACRO(stem, ...` defining `stemSUFFIX()`. The table lists the rows in
# the order of their files' names, then of their lines; FIRST, the kind's default, comes first.
# Every file of the folder but OTHER (the kind's shared code) must define a row: one that defines
# none (a misspelt definition) fails the build rather than leaving its rows out.
# The rows are functions a generated file calls, not static registrars: a static library's object
# that nothing references is dropped by the linker, and its rows with it.
#
#   troupe_registry(OUT_VAR FOLDER dir HEADER path NAMESPACE ns ROW type TABLE function
#                   [MACRO name SUFFIX suffix] [FIRST function] [OTHER file])
# sets OUT_VAR to the generated source (<build>/registries/<folder>.cc) for the folder's target.

set(TROUPE_REGISTRY_SCRIPT ${CMAKE_CURRENT_LIST_FILE})

if(CMAKE_SCRIPT_MODE_FILE)
  # cmake -DROOT=... -DFOLDER=... -DOUT=... (and the arguments above) -P registry.cmake
  file(GLOB files ${ROOT}/${FOLDER}/*.cc)
  foreach(other ${OTHER})
    list(REMOVE_ITEM files ${ROOT}/${FOLDER}/${other})
  endforeach()
  list(SORT files)
  set(space "[ \t\r\n]")
  if(MACRO)
    set(pattern "\n${MACRO}\\(${space}*([A-Za-z0-9_]+),")
  else()
    set(pattern "\n${ROW}${space}+([A-Za-z0-9_]+)\\(\\)${space}*{")
  endif()
  if(MACRO)
    set(form "${MACRO}(name, ...")
  else()
    set(form "${ROW} name() {")
  endif()
  set(rows "")
  foreach(f ${files})
    file(READ ${f} text)
    string(REGEX MATCHALL "${pattern}" found "\n${text}")
    if(NOT found)
      if(OTHER)
        set(except " but ${OTHER}")
      endif()
      message(FATAL_ERROR "${f} defines no row of ${FOLDER}/: every file there${except} defines "
                          "one or more, each on a line starting '${form}'")
    endif()
    foreach(definition ${found})
      string(REGEX REPLACE "${pattern}" "\\1" name "${definition}")
      list(APPEND rows "${name}${SUFFIX}")
    endforeach()
  endforeach()
  if(FIRST)
    list(FIND rows ${FIRST} at)
    if(at EQUAL -1)
      message(FATAL_ERROR "registry ${FOLDER}: no row ${FIRST}, the default")
    endif()
    list(REMOVE_AT rows ${at})
    list(PREPEND rows ${FIRST})
  endif()
  set(text "// The table of ${FOLDER}/*.cc, written by cmake/registry.cmake: do not edit.\n")
  string(APPEND text "#include \"${HEADER}\"\n\nnamespace ${NAMESPACE} {\n\n")
  set(calls "")
  foreach(row ${rows})
    string(APPEND text "${ROW} ${row}();\n")
    string(APPEND calls "      ${row}(),\n")
  endforeach()
  string(APPEND text "\nconst std::vector<${ROW}>& ${TABLE}() {\n"
                     "  static const std::vector<${ROW}> table{\n${calls}  };\n"
                     "  return table;\n}\n\n}  // namespace ${NAMESPACE}\n")
  # Rewritten only when it changes, so that an edit elsewhere in a row's file recompiles nothing.
  file(WRITE ${OUT}.new "${text}")
  file(COPY_FILE ${OUT}.new ${OUT} ONLY_IF_DIFFERENT)
  file(REMOVE ${OUT}.new)
  return()
endif()

# Sets TROUPE_LAYER_TABLE, TROUPE_OPTIMIZER_TABLE, TROUPE_STORE_TABLE and TROUPE_SCHEDULE_TABLE to
# the four tables' sources, made by rules in the calling folder (the library's, or the fuzzers').
macro(troupe_registries)
  troupe_registry(TROUPE_LAYER_TABLE FOLDER kernels/layer_types HEADER kernels/net_graph.h
                  NAMESPACE troupe::kernels::graph ROW LayerType TABLE layerTable
                  MACRO TROUPE_LAYER_TYPE SUFFIX LayerType)
  troupe_registry(TROUPE_OPTIMIZER_TABLE FOLDER kernels/optimizers HEADER kernels/optimizer.h
                  NAMESPACE troupe::kernels ROW OptimizerInfo TABLE optimizers FIRST sgdOptimizer)
  troupe_registry(TROUPE_STORE_TABLE FOLDER rendezvous/stores HEADER rendezvous/url.h
                  NAMESPACE troupe::rendezvous ROW StoreBackend TABLE storeBackends
                  FIRST tcpStoreBackend)
  troupe_registry(TROUPE_SCHEDULE_TABLE FOLDER actors/schedules HEADER actors/schedules/schedule.h
                  NAMESPACE troupe::actors ROW ScheduleInfo TABLE schedules FIRST localSchedule
                  OTHER schedule.cc)
endmacro()

function(troupe_registry out)
  cmake_parse_arguments(arg "" "FOLDER;HEADER;NAMESPACE;ROW;TABLE;MACRO;SUFFIX;FIRST;OTHER" "" ${ARGN})
  # A file added or removed reconfigures; an edited one reruns the command. The files' listing is
  # in the command line, so that a file removed (the others older than the table) reruns it too.
  file(GLOB files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${arg_FOLDER}/*.cc)
  string(MD5 listing "${files}")
  string(MAKE_C_IDENTIFIER ${arg_FOLDER} id)
  set(generated ${PROJECT_BINARY_DIR}/registries/${id}.cc)
  set(defines "")
  foreach(key HEADER NAMESPACE ROW TABLE MACRO SUFFIX FIRST OTHER)
    if(arg_${key})
      list(APPEND defines "-D${key}=${arg_${key}}")
    endif()
  endforeach()
  add_custom_command(
    OUTPUT ${generated}
    COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} -DFOLDER=${arg_FOLDER} -DOUT=${generated}
            -DLISTING=${listing} ${defines} -P ${TROUPE_REGISTRY_SCRIPT}
    DEPENDS ${files} ${TROUPE_REGISTRY_SCRIPT}
    COMMENT "The table of ${arg_FOLDER}/"
    VERBATIM)
  set(${out} ${generated} PARENT_SCOPE)
endfunction()
